"""Generated stubs of the contract, package `tensord.v1` (`make proto` writes them).

`inference_pb2` holds the messages and enums, `inference_pb2_grpc` the service stub.
"""
