"""FilterForward cloud service."""
