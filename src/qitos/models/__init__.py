"""qitos.models: model adapters, one module each (``base``, ``openai_compat``, ``scripted``,
``local``). Import adapters by module path; this package imports nothing heavy."""

__all__: list[str] = []
