"""qitos.kit: replaceable implementations of core protocols (memory, context, parsers, tools),
bound by name through ``compose(extensions=...)``."""

__all__: list[str] = []
