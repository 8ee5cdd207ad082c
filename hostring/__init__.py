"""hostring kernel: what every service shares (URL identity, the ring, wire stubs, clock, errors)."""

__version__ = "0.1.0"
