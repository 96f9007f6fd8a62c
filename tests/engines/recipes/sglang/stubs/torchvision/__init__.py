"""Stand-in for torchvision in the SGLang engine venv (not a real torchvision).

The published torchvision wheels do not load next to torch 2.13 (CPU), and installing one can
replace torch with a CUDA build. SGLang's config and multimodal modules import torchvision at
module level (and transformers then imports `torchvision.io`) although nothing on the HiCache
path calls it. Every name here is a placeholder that raises if it is ever called.
"""

from torchvision._placeholder import __getattr__  # noqa: F401

__version__ = "0.0.0+cellar.stub"
