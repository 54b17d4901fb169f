"""Rewrapping a gRPC method handler: what server interceptors that change a call's behaviour need."""

from __future__ import annotations

from collections.abc import Callable

import grpc


def behavior_of(handler: grpc.RpcMethodHandler) -> Callable:
    """The function that answers the call, whatever its kind."""
    return handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream


def with_behavior(handler: grpc.RpcMethodHandler, behavior: Callable) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind, with its (de)serializers, that runs ``behavior``."""
    serializers = {"request_deserializer": handler.request_deserializer,
                   "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(behavior, **serializers)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(behavior, **serializers)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(behavior, **serializers)
    return grpc.stream_stream_rpc_method_handler(behavior, **serializers)
