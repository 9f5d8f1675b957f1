"""qitos.kit.parsers: text decision protocols (ReAct, JSON) and native tool-call decoding."""

__all__: list[str] = []
