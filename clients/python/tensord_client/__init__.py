"""Python client for tensord: sync and asyncio, NumPy arrays in and out."""

from tensord_client._common import TLSOptions, retry_after
from tensord_client.aio import AsyncClient
from tensord_client.client import Client

__all__ = ["AsyncClient", "Client", "TLSOptions", "retry_after"]
