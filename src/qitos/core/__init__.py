"""qitos.core: the contracts (dataclasses, protocols, errors, codec). Import names from their modules:
``qitos.core.state``, ``qitos.core.task``, ``qitos.core.decision``, ``qitos.core.tool``,
``qitos.core.exchange``, ``qitos.core.context``, ``qitos.core.request_view``, ``qitos.core.memory``,
``qitos.core.identity``, ``qitos.core.codec``, ``qitos.core.errors``."""

__all__: list[str] = []
