"""One SGLang "instance" (or one tp rank of one) in its own process, for the engine tests.

    python sglang_worker.py '<json>'

The JSON names the cluster address, the rank, world size and gloo port, the model, the page
shape (`sglang_harness.Shape` fields) and a list of steps run in order:
    {"op": "backup", "pages": N, "seed": S}      -> {"tokens": backed-up tokens}
    {"op": "wipe"}                               -> {}
    {"op": "prefetch", "pages": N, "seed": S}    -> {"hit": pages, "completed": pages,
                                                     "exact": pages whose bytes are exact}
    {"op": "keys", "pages": N, "seed": S}        -> {"keys": the Cellar keys of those pages}
The last line of stdout is the JSON list of step results.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from sglang_harness import Engine, Shape, init_distributed


def main() -> int:
    spec = json.loads(sys.argv[1])
    init_distributed(spec.get("rank", 0), spec.get("world_size", 1), spec.get("port"))
    engine = Engine(spec["address"], model=spec["model"], shape=Shape(**spec.get("shape", {})),
                    extra=spec.get("extra", {}), rank=spec.get("rank", 0),
                    world_size=spec.get("world_size", 1))
    out: list[dict[str, object]] = []
    try:
        for step in spec["steps"]:
            op = step["op"]
            if op == "backup":
                out.append({"tokens": engine.backup(step["pages"], step["seed"])})
            elif op == "wipe":
                engine.wipe()
                out.append({})
            elif op == "prefetch":
                got = engine.prefetch(step["pages"], step["seed"])
                exact = (engine.exact_pages(got.host_indices, step["seed"], got.completed_pages)
                         if got.completed_pages else 0)
                out.append({"hit": got.hit_pages, "completed": got.completed_pages,
                            "exact": exact})
            elif op == "keys":
                hashes = engine.page_hashes(engine.tokens(step["pages"], step["seed"]))
                out.append({"keys": engine.backend.object_keys(hashes)})
            else:
                raise ValueError(f"unknown step {op!r}")
            if spec.get("world_size", 1) > 1:
                # The ranks of one instance move step by step, as the scheduler keeps them: a
                # rank that writes nothing (MLA's non-writers) must not prefetch before the
                # writing rank's backup is acked.
                dist.barrier()
    finally:
        engine.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
