"""Models: what a model is and where its weights and tokenizer come from.

config (ModelConfig), param_decls (one declaration per parameter), model (the Llama/Qwen forward as pure
functions), kv_cache (the cache pytree), eagle (the EAGLE-3 draft); weight formats: quant (int8), blocks (GGUF
blocks); files: families (what a config says, or why we cannot compute it), model_files (GGUF and safetensors),
sharded_load (safetensors onto a mesh), checkpoints (our Orbax format, loading by name or path), named_configs (the
paper's models by name), drafts (off-the-shelf drafts); tokenizer and chat_template (a model's own tokenizer,
template and EOS set). A new model family or weight format is taught in this folder.
"""
