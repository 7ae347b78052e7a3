"""A LoRA adapter in PEFT's layout for tests/support/tinymodel.py's tiny Llama.

    .cache/vllm/bin/python tests/support/tinylora.py MODEL_DIRECTORY ADAPTER_DIRECTORY

Run with the vLLM venv's interpreter (it needs ``torch`` and ``safetensors``).
``adapter_config.json`` and ``adapter_model.safetensors`` as PEFT saves them
(keys ``base_model.model.<module>.lora_A.weight``, A: [r, in], B: [out, r]),
with seeded random A and B far larger than the base's own weights, so that the
adapter changes what the model says.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

RANK, ALPHA = 8, 16
TARGETS = ("q_proj", "v_proj", "o_proj", "down_proj")


def adapter(model: Path, directory: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head = hidden // config["num_attention_heads"]
    shapes = {"q_proj": (hidden, config["num_attention_heads"] * head),
              "v_proj": (hidden, config["num_key_value_heads"] * head),
              "o_proj": (config["num_attention_heads"] * head, hidden),
              "down_proj": (inter, hidden)}
    gen = torch.Generator().manual_seed(1)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            part = "mlp" if target == "down_proj" else "self_attn"
            stem = f"base_model.model.model.layers.{layer}.{part}.{target}"
            fan_in, fan_out = shapes[target]
            tensors[f"{stem}.lora_A.weight"] = torch.randn(RANK, fan_in, generator=gen)
            tensors[f"{stem}.lora_B.weight"] = torch.randn(fan_out, RANK, generator=gen)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
        "lora_dropout": 0.0, "bias": "none", "target_modules": list(TARGETS),
        "base_model_name_or_path": str(model), "fan_in_fan_out": False,
        "modules_to_save": None, "use_rslora": False, "use_dora": False,
    }, indent=2))


if __name__ == "__main__":
    adapter(Path(sys.argv[1]), Path(sys.argv[2]))
