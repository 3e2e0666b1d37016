"""Writes a tiny random-weight Llama model (2 layers, hidden 128, 512-word vocabulary) with a
word-level tokenizer and a chat template into OUT_DIR, for vLLM to serve on a GPU with no network:
its forward pass is real (real kernels, CUDA graphs), its words are noise.

    python tests/gpu/tiny_model.py OUT_DIR
"""
import json
import os
import sys

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(509)]
vocab = {w: i for i, w in enumerate(words)}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
)
fast.chat_template = (
    "{% for m in messages %}{{ m['content'] }} {% endfor %}"
)
fast.save_pretrained(out)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=len(words),
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="float16",
)
LlamaForCausalLM(config).to(torch.float16).save_pretrained(out)
json.dump({"words": len(words)}, open(os.path.join(out, "inferscope_tiny.json"), "w"))
print(out)
