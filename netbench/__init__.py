"""netbench: network-emulation testbed controller for distributed deep-learning experiments."""

__version__ = "0.1.0"
