import pytest

from mutransfer import rules


@pytest.mark.parametrize("table", ["table3", "table8"])
def test_adam_eps_scales_like_the_gradient(table):
    # Gradient scale = adam lr / sgd lr (both give the same Θ(1) update), and ε must follow it.
    for role, rule in rules.formulation_rules(table).items():
        for k in range(2):
            assert rule.adam_eps[k] == rule.adam_lr[k] - rule.sgd_lr[k], (table, role)


def test_table3_and_table8_differ_only_by_the_abc_symmetry_on_the_readout():
    t3, t8 = rules.TABLE3["output"], rules.TABLE8["output"]
    theta = 1.0  # Table 8 = Table 3 with W → m·W, multiplier → multiplier/m (θ = m¹)
    assert t8.forward[0] == t3.forward[0] - theta
    assert t8.init[0] == t3.init[0] + theta
    assert t8.sgd_lr[0] == t3.sgd_lr[0] + 2 * theta
    assert t8.adam_lr[0] == t3.adam_lr[0] + theta
    for role in ("input", "vector", "hidden", "scalar"):
        assert rules.TABLE3[role] == rules.TABLE8[role]


def test_factor_is_exactly_one_at_base_width():
    for rule in rules.TABLE3.values():
        for col in (rule.init, rule.sgd_lr, rule.adam_lr, rule.adam_eps):
            assert rules.factor(col, 1.0, 1.0) == 1.0
    assert rules.factor((-0.5, 0.0), 4.0, 4.0) == 0.5
    assert rules.factor((-1.0, 1.0), 2.0, 8.0) == 4.0


def test_unknown_names():
    with pytest.raises(ValueError, match="unknown optimizer 'shampoo'"):
        rules.optimizer_family("shampoo")
    with pytest.raises(TypeError, match="optimizer must be a name"):
        rules.optimizer_rule(None)
    with pytest.raises(ValueError, match="unknown formulation"):
        rules.formulation_rules("table5")
    with pytest.raises(ValueError, match="unknown role 'embedding'"):
        rules.TunableMultipliers(init={"embedding": 2.0})


def test_depth_rules_eps_follows_the_gradient_and_branch_end_is_the_abc_shift_of_block():
    for name, rule in rules.DEPTH_RULES.items():
        for k in range(2):
            assert rule.adam_eps[k] == rule.adam_lr[k] - rule.sgd_lr[k], name
    block, end = rules.DEPTH_RULES["block"], rules.DEPTH_RULES["branch_end"]
    theta = rules.BRANCH_MULTIPLIER  # folding the multiplier: W' = m_L^-α · W
    for k in range(2):
        assert end.init[k] == block.init[k] + theta[k]
        assert end.adam_lr[k] == block.adam_lr[k] + theta[k]
        assert end.sgd_lr[k] == block.sgd_lr[k] + 2 * theta[k]
        assert end.adam_eps[k] == block.adam_eps[k] - theta[k]
    # Depth-µP (α=½) with SGD keeps the lr (TP6); CompleteP (α=1) with Adam keeps the lr.
    assert rules.depth_factor(block.sgd_lr, 16.0, 0.5) == 1.0
    assert rules.depth_factor(block.adam_lr, 16.0, 1.0) == 1.0
    assert rules.depth_factor(block.adam_lr, 16.0, 0.5) == 0.25
    assert rules.depth_factor(block.adam_eps, 4.0, 1.0) == 0.25
    assert all(
        rules.depth_factor(c, 1.0, a) == 1.0
        for r in rules.DEPTH_RULES.values()
        for c in (r.init, r.sgd_lr, r.adam_lr, r.adam_eps)
        for a in (0.5, 1.0)
    )


@pytest.mark.parametrize("table", ["table3", "table8"])
def test_every_optimizer_column_follows_from_the_entry_size_column(table):
    # The identities the table's docstring derives: the spectral step of a low-rank aligned update is
    # its entry size × √(fan_in·fan_out); Adafactor's step carries RMS(W) ∝ init.
    for role, rule in rules.formulation_rules(table).items():
        for k in range(2):
            if role != "scalar":
                assert rule.spectral_lr[k] == rule.adam_lr[k] + 0.5, (table, role)
            assert rule.adafactor_lr[k] == rule.adam_lr[k] - rule.init[k], (table, role)


def test_depth_columns_of_normalised_updates_move_alike():
    for name, rule in rules.DEPTH_RULES.items():
        assert rule.spectral_lr == rule.adam_lr, name
        for k in range(2):
            assert rule.adafactor_lr[k] == rule.adam_lr[k] - rule.init[k], name


def test_every_optimizer_reads_existing_columns():
    for name, r in rules.OPTIMIZERS.items():
        cols = [r.lr, *r.eps]
        for c in cols:
            assert hasattr(rules.TABLE3["hidden"], c) and hasattr(rules.DEPTH_RULES["block"], c), (name, c)
        assert r.partner is None or r.partner in rules.OPTIMIZERS
