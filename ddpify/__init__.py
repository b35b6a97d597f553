"""ddpify: rewrite nn.DataParallel training scripts into DistributedDataParallel scripts.

Importing this package is cheap: it never imports torch, and libcst is only imported by the
modules that parse code (``ddpify.api`` and below).
"""

__version__ = "0.1.0"
