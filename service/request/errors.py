"""What went wrong with a request, as its status and message, raised by any check whatever
transport carried it. Each transport maps it to its own shape at its edge: HTTP to the status
and its route family's JSON body (protocols/errors.py), gRPC to a status code
(protocols/rpc/server.py CODES), the binary protocol to a status byte."""

from __future__ import annotations


class RequestError(Exception):
    """A request refused: `status` in HTTP's numbering (the one every transport's table maps
    from), `message` for the client as it stands."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
