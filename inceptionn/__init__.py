"""inceptionn: in-network gradient compression for commodity Linux hosts."""

__version__ = "0.1.0"
