"""Old import paths kept for one release: `import mutransfer.roles` still works, with a
DeprecationWarning naming the new place. The core modules moved into `mutransfer._core` (internal)
in 0.2 — what users call is on `mutransfer` itself (`mt.parametrize`, `mt.export`, ...) — and two
sweep modules were renamed (`objective` → `scale`, `objectives` → `recipes`). The one mechanism for
every moved module of the package (`mt.limits`, standing alone, keeps its own)."""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

# old module path → (new module path, what to use instead)
MOVED_MODULES: dict[str, tuple[str, str]] = {
    "mutransfer.roles": ("mutransfer._core.roles", "mt.MuPWarning / mt.errors; roles are internal"),
    "mutransfer.attention": ("mutransfer._core.attention", "mt.attn_scale / mt.attn_logits"),
    "mutransfer.depth": ("mutransfer._core.depth", "mt.residual_branch"),
    "mutransfer.shapes": ("mutransfer._core.shapes", "mt.WidthShapes / mt.save_shapes / mt.load_shapes"),
    "mutransfer.spec": ("mutransfer._core.spec", "mt.MuSpec"),
    "mutransfer.devices": ("mutransfer._core.devices", "mt.resolve_device"),
    "mutransfer.sweep.objective": ("mutransfer.sweep.scale", "Scale, Pruned and mup_kwargs from mutransfer.sweep"),
    "mutransfer.sweep.objectives": (
        "mutransfer.sweep.recipes",
        "mutransfer.sweep.recipes (load_objective from mutransfer.sweep)",
    ),
}


class _MovedModuleFinder:
    """A meta path finder and loader (the protocols, without importing importlib.abc at start-up)."""

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None):
        if fullname not in MOVED_MODULES:
            return None
        from importlib.util import spec_from_loader

        # the Loader protocol is create_module + exec_module (importlib.abc is not imported at start-up)
        return spec_from_loader(fullname, self)  # type: ignore[arg-type]

    def create_module(self, spec) -> ModuleType:
        new, instead = MOVED_MODULES[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}{' (internal)' if '._' in new else ''} and will be removed in the "
            f"next release; use {instead}",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module is already executed


def install_module_aliases() -> None:
    """Put the finder of moved modules on `sys.meta_path` (once)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
