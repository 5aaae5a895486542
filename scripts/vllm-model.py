"""Converts the SmolLM2-135M-Instruct GGUF that scripts/fetch-model.sh fetches into the Hugging Face
format vLLM loads (config.json, tokenizer, safetensors), through transformers' GGUF loading (the
Q4_1 weights are dequantized to float32), and saves it in DEST.

    python scripts/vllm-model.py [GGUF] [DEST]
      GGUF default ~/.cache/cxlkv/models/SmolLM2-135M-Instruct.Q4_1.gguf
      DEST default ~/.cache/cxlkv/models/SmolLM2-135M-Instruct-hf
Needs transformers and gguf (scripts/setup-engines.sh with CXLKV_ENGINES=vllm installs them).
"""

import os
import shutil
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never wait on the hub

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

models = os.path.expanduser("~/.cache/cxlkv/models")
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf")
dest = sys.argv[2] if len(sys.argv) > 2 else os.path.join(models, "SmolLM2-135M-Instruct-hf")
if os.path.exists(os.path.join(dest, "config.json")):
    print("vllm-model: %s already holds a converted model" % dest)
    sys.exit(0)
t0 = time.time()
d, f = os.path.split(os.path.abspath(src))
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
gguf = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype="float32")
# The GGUF weights come dequantized; the model is saved as a plain float32 one.
config = gguf.config
if hasattr(config, "quantization_config"):
    del config.quantization_config
model = AutoModelForCausalLM.from_config(config, dtype="float32")
missing, unexpected = model.load_state_dict(gguf.state_dict(), strict=False)
if unexpected or [k for k in missing if "lm_head" not in k]:
    sys.exit("vllm-model: weights do not match: missing %s, unexpected %s" % (missing, unexpected))
model.tie_weights()
part = dest + ".partial"
shutil.rmtree(part, ignore_errors=True)
model.save_pretrained(part)
tok.save_pretrained(part)
shutil.rmtree(dest, ignore_errors=True)  # no config.json there: an earlier run's leftovers
os.replace(part, dest)
print("vllm-model: %s -> %s in %.0f s" % (src, dest, time.time() - t0))
