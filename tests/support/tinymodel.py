"""A tiny Llama model made offline: config, random safetensors weights, a BPE tokenizer.

    .cache/vllm/bin/python tests/support/tinymodel.py DIRECTORY

Run with the vLLM venv's interpreter (``make vllm``): it needs ``torch``,
``safetensors`` and ``tokenizers``, which llmgw's own venv does not have. No
hub is reached: the tokenizer is trained here on a few sentences (byte-level
BPE, so any text encodes), the weights are seeded random numbers. vLLM loads
the directory as it would a downloaded snapshot, and answers with nonsense
tokens: enough to prove the path from cluster file to client, not the model.

The shape is chosen for vLLM's CPU backend: head size 64 (its attention
kernels support a fixed list of head sizes), float32 (the CPU here has AVX2
only, no AVX-512 BF16). About 1.3 M parameters, 6 MB on disk.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 512
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 256, 2, 4, 2, 512
MAX_POSITIONS = 2048
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
CORPUS = [
    "The capital of France is Paris.", "One, two, three, four, five.",
    "Say hello to the model, and it says hello back.",
    "A small model made offline answers with random words.",
    "llmgw plans, places and serves models on nodes.",
] * 20
# A plain template: vLLM's chat endpoint needs one, and a tokenizer trained
# here has none of its own.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def tokenizer(directory: Path) -> None:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }, indent=1))
    (directory / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}))


def config(directory: Path) -> None:
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HIDDEN // HEADS,
        "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "torch_dtype": "float32",
    }, indent=1))
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}))


def weights(directory: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    head = HIDDEN // HEADS

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    tensors = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN),
               "model.norm.weight": torch.ones(HIDDEN), "lm_head.weight": rand(VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(HIDDEN),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN),
            p + "self_attn.q_proj.weight": rand(HEADS * head, HIDDEN),
            p + "self_attn.k_proj.weight": rand(KV_HEADS * head, HIDDEN),
            p + "self_attn.v_proj.weight": rand(KV_HEADS * head, HIDDEN),
            p + "self_attn.o_proj.weight": rand(HIDDEN, HEADS * head),
            p + "mlp.gate_proj.weight": rand(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": rand(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": rand(HIDDEN, INTERMEDIATE),
        }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str]) -> int:
    directory = Path(argv[0])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer(directory)
    config(directory)
    weights(directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
