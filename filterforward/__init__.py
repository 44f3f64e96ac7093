"""The filterforward command line."""
