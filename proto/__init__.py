"""cellar.proto: the contract every part shares.

Owns `cellar.proto` (the gRPC service and messages), its generated code (`make proto`
regenerates it; a test fails when it is stale) and `grant` (the signed-capability layout
that the master produces and storage nodes check). It must not import any other Cellar part.
Import rule: may import only cellar.proto.*
"""
