"""Generated stubs of the agentloop.v1 contracts (``make protos`` or the package build writes them here).

Modules: ``generation_pb2`` / ``generation_pb2_grpc`` (TokenGenerate), ``engine_pb2`` / ``engine_pb2_grpc``
(EngineControl), ``tool_pb2`` / ``tool_pb2_grpc`` (ToolExecute).
"""
