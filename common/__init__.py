"""What the edge and the cloud share beyond microclassifiers: the wire protocol, CURVE keys and YAML
configuration files. Light (pydantic, pyzmq, PyYAML); it imports only `models`' light modules, and neither
`edge` nor `cloud` (tests/test_layering.py holds the package graph)."""
