"""Placeholders for the stub torchvision: any attribute resolves, any call raises."""


class _Meta(type):
    def __getattr__(cls, name: str) -> "_Meta":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (_Placeholder,), {})


class _Placeholder(metaclass=_Meta):
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("torchvision is a stub in the Cellar SGLang engine venv")


def __getattr__(name: str) -> _Meta:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Meta(name, (_Placeholder,), {})
