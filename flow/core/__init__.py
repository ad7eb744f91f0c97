"""Stand-ins for the few names of OneFlow's generated protobuf modules (`oneflow.core.*`) that its own
model files import: see flow/core/operator/op_conf_pb2.py."""
