"""What several test modules share: fixtures and helpers imported by name (tests/ is on pytest's
pythonpath), never from another test module."""
