"""Part of the stub torchvision (see torchvision/__init__.py)."""

from torchvision._placeholder import __getattr__  # noqa: F401
