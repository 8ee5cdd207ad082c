"""hostring kernel: what every service shares (URL identity, the ring, wire stubs, clock, errors)."""

__version__ = "0.1.0"

from hostring import native as _native

_native.check()
