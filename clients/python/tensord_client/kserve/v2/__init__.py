"""Generated modules of the Open Inference Protocol (KServe v2) gRPC service,
`inference.GRPCInferenceService`, from Triton's published protos (`make proto` writes them).

`grpc_service_pb2` holds the messages, `model_config_pb2` the model configuration,
`grpc_service_pb2_grpc` the service stub.
"""
