"""``sandhold policy test|explain|diff``: policies tested in CI, an application over ``call()``."""

__all__: list[str] = []
