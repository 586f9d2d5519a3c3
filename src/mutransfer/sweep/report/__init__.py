"""The HTML report: `plots`, `report_page` (the template) → `report`."""

__all__: list[str] = []
