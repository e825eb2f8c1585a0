"""What one call records into a CUDA graph: the node count and kinds of a graph that captured one
``numbatc.gemm`` call, against one ``torch.matmul`` of the same operands (b = w.T), per shape.
``bench --timing graph`` replays such graphs; a call that records more than its kernel (a
tensor-map write, a workspace memset) pays for it in every replay.

    python scripts/diag/graph_nodes.py 16x6144x4096 4096x4096x4096
"""

import json
import sys


def nodes(graph):
    """[node type name, ...] of a torch.cuda.CUDAGraph."""
    from cuda.bindings import driver

    raw = driver.CUgraph(graph.raw_cuda_graph())
    err, _, count = driver.cuGraphGetNodes(raw, 0)
    err, found, count = driver.cuGraphGetNodes(raw, count)
    kinds = []
    for node in found[:count]:
        err, kind = driver.cuGraphNodeGetType(node)
        kinds.append(kind.name.replace("CU_GRAPH_NODE_TYPE_", "").lower())
    return kinds


def main(shapes):
    import torch

    import numbatc

    for spec in shapes:
        m, n, k = (int(v) for v in spec.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        row = {"shape": spec}
        for name, fn in (("numbatc", lambda: numbatc.gemm(a, w.T)), ("torch", lambda: a @ w.T)):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(graph):
                fn()
            row[name] = nodes(graph)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
