"""`flow.core.operator`: see op_conf_pb2.py."""
