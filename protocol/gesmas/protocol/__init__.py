"""The hand-written half of the wire contract, shared by the client and the server: value
conversion (`values`) and the error metadata (`errors`). The other half is the generated code
of protos/gesmas/v1. Neither the client nor this package imports the server."""
