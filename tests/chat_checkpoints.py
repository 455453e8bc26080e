"""Tiny random-weight chat checkpoints carrying the chat template strings that Llama 3 Instruct, Qwen2 Instruct,
Mistral Instruct v0.1, Qwen3, Gemma 2, Gemma 3, Phi-3.5-mini and SmolLM3 publish in their tokenizer files, with each
family's special tokens, BOS behaviour and generation_config.json EOS ids, on that family's architecture. The
template strings are data, reproduced as published (each names the copy it was taken from)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.checkpoints import _TEXT, FAMILY_VARIANTS, family_config, llama_config, perturb_norms

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}"
)

# Gemma 2 (google/gemma-2-2b-it): ggml-org/llama.cpp models/templates/google-gemma-2-2b-it.jinja (read in its fork
# ye-NX/llama.cpp); the same bytes as huggingface/huggingface.js packages/ollama-utils/src/chat-template-automap.ts
# ("library/gemma2:2b", the template its GGUF carries). It raises on a system message.
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
# Phi-3.5-mini-instruct: ggml-org/llama.cpp models/templates/microsoft-Phi-3.5-mini-instruct.jinja (read in ye-NX/llama.cpp);
# the same bytes as huggingface.js' chat-template-automap.ts ("library/phi3.5:3.8b"). It writes no BOS.
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
# Qwen3 (Qwen/Qwen3-0.6B): huggingface/huggingface.js packages/jinja/test/e2e.test.js ("Qwen/Qwen3-0.6B"); the same
# bytes as its chat-template-automap.ts ("library/qwen3:0.6b"), and as ggml-org/llama.cpp
# models/templates/Qwen-Qwen3-0.6B.jinja reads (in its fork ye-NX/llama.cpp). Past assistant turns lose their <think> block; `enable_thinking=False` opens the answer
# with an empty one, and left undefined (transformers' default) the model opens its own.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""
# Gemma 3 (google/gemma-3-270m-it): huggingface/huggingface.js packages/ollama-utils/src/chat-template-automap.ts
# ("library/gemma3:270m", the template its GGUF carries; its "library/gemma3:1b" holds an earlier revision without
# the branch for string content). A system message is folded into the first user turn.
GEMMA3_TEMPLATE = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
"""
# SmolLM3 (HuggingFaceTB/SmolLM3-3B): huggingface/huggingface.js packages/jinja/test/e2e.test.js
# ("HuggingFaceTB/SmolLM3-3B"). Its system header carries today's date (strftime_now) and a reasoning mode.
SMOLLM3_TEMPLATE = (r"""{# ───── defaults ───── #}
{%- if enable_thinking is not defined -%}
{%- set enable_thinking = true -%}
{%- endif -%}

{# ───── reasoning mode ───── #}
{%- if enable_thinking -%}
  {%- set reasoning_mode = "/think" -%}
{%- else -%}
  {%- set reasoning_mode = "/no_think" -%}
{%- endif -%}

{# ───── header (system message) ───── #}
{{- "<|im_start|>system\n" -}}

{%- if messages[0].role == "system" -%}
  {%- set system_message = messages[0].content -%}
  {%- if "/no_think" in system_message -%}
    {%- set reasoning_mode = "/no_think" -%}
  {%- elif "/think" in system_message -%}
    {%- set reasoning_mode = "/think" -%}
  {%- endif -%}
  {%- set custom_instructions = system_message.replace("/no_think", "").replace("/think", "").rstrip() -%}
{%- endif -%}

{%- if "/system_override" in system_message -%}
  {{- custom_instructions.replace("/system_override", "").rstrip() -}}
  {{- "<|im_end|>\n" -}}
{%- else -%}
  {{- "## Metadata\n\n" -}}
  {{- "Knowledge Cutoff Date: June 2025\n" -}}
  {%- set today = strftime_now("%d %B %Y") -%}
  {{- "Today Date: " ~ today ~ "\n" -}}
  {{- "Reasoning Mode: " + reasoning_mode + "\n\n" -}}
"""
    "  \n"  # a line of two spaces, as published
    r"""  {{- "## Custom Instructions\n\n" -}}
  {%- if custom_instructions -%}
    {{- custom_instructions + "\n\n" -}}
  {%- elif reasoning_mode == "/think" -%}
    {{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves thoroughly exploring questions through a systematic thinking process before providing the final precise and accurate solutions. This requires engaging in a comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, backtracking, and iteration to develop well-considered thinking process. Please structure your response into two main sections: Thought and Solution using the specified format: <think> Thought section </think> Solution section. In the Thought section, detail your reasoning process in steps. Each step should include detailed considerations such as analysing questions, summarizing relevant findings, brainstorming new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting previous steps. In the Solution section, based on various attempts, explorations, and reflections from the Thought section, systematically present the final solution that you deem correct. The Solution section should be logical, accurate, and concise and detail necessary steps needed to reach the conclusion.\n\n" -}}
  {%- else -%}
    {{- "You are a helpful AI assistant named SmolLM, trained by Hugging Face.\n\n" -}}
  {%- endif -%}

  {%- if xml_tools or python_tools or tools -%}
    {{- "### Tools\n\n" -}}
    {%- if xml_tools or tools -%}
      {%- if tools -%}
        {%- set xml_tools = tools -%}
      {%- endif -%}
      {%- set ns = namespace(xml_tool_string="You may call one or more functions to assist with the user query.\nYou are provided with function signatures within <tools></tools> XML tags:\n\n<tools>\n") -%}
      {%- for tool in xml_tools[:] -%} {# The slicing makes sure that xml_tools is a list #}
        {%- set ns.xml_tool_string = ns.xml_tool_string ~ (tool | string) ~ "\n" -%}
      {%- endfor -%}
      {%- set xml_tool_string = ns.xml_tool_string + "</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" -%}
      {{- xml_tool_string -}}
    {%- endif -%}
    {%- if python_tools -%}
      {%- set ns = namespace(python_tool_string="When you send a message containing Python code between '<code>' and '</code>' tags, it will be executed in a stateful Jupyter notebook environment, and you will then be given the output to continued reasoning in an agentic loop.\n\nYou can use the following tools in your python code like regular functions:\n<tools>\n") -%}
      {%- for tool in python_tools[:] -%} {# The slicing makes sure that python_tools is a list #}
        {%- set ns.python_tool_string = ns.python_tool_string ~ (tool | string) ~ "\n" -%}
      {%- endfor -%}
      {%- set python_tool_string = ns.python_tool_string + "</tools>\n\nThe state persists between code executions: so variables that you define in one step are still available thereafter." -%}
      {{- python_tool_string -}}
    {%- endif -%}
    {{- "\n\n" -}}
    {{- "<|im_end|>\n" -}}
  {%- endif -%}
{%- endif -%}
{# ───── main loop ───── #}
{%- for message in messages -%}
    {%- set content = message.content if message.content is string else "" -%}
    {%- if message.role == "user" -%}
        {{ "<|im_start|>" + message.role + "\n"  + content + "<|im_end|>\n" }}
    {%- elif message.role == "assistant" -%}
        {% generation %}
        {%- if reasoning_mode == "/think" -%}
            {{ "<|im_start|>assistant\n" + content.lstrip("\n") + "<|im_end|>\n" }}
        {%- else -%}
            {{ "<|im_start|>assistant\n" + "<think>\n\n</think>\n" + content.lstrip("\n") + "<|im_end|>\n" }}
        {%- endif -%}
        {% endgeneration %}
    {%- elif message.role == "tool" -%}
    {{ "<|im_start|>" + "user\n"  + content + "<|im_end|>\n" }}
    {%- endif -%}
{%- endfor -%}
{# ───── generation prompt ───── #}
{%- if add_generation_prompt -%}
    {%- if reasoning_mode == "/think" -%}
        {{ "<|im_start|>assistant\n" }}
    {%- else -%}
        {{ "<|im_start|>assistant\n" + "<think>\n\n</think>\n"  }}
    {%- endif -%}
{%- endif -%}""")

# style: special tokens (trained first, in this order), non-special added tokens, bos / eos (a BOS also starts plain
# text, as each family's tokenizer does), the template and the file that stores it, the model variant
# (tests/checkpoints.py), generation_config.json's EOS tokens (each family's published ones, by name), and what the
# template does with a system message: its own turn, folded into the first user turn, or refused (the row fails)
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
STYLES = {
    "llama3": dict(specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"], bos="<|begin_of_text|>", eos="<|end_of_text|>",
                   template=LLAMA3_TEMPLATE, file="tokenizer_config.json", variant="llama_gqa_llama3",
                   gen_eos=["<|end_of_text|>", "<|eot_id|>"], system="turn"),
    "qwen2": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
                  template=QWEN2_TEMPLATE, file="chat_template.jinja", variant="qwen2",
                  gen_eos=["<|im_end|>", "<|endoftext|>"], system="turn"),
    "mistral": dict(specials=["<unk>", "<s>", "</s>"], bos="<s>", eos="</s>", template=MISTRAL_TEMPLATE,
                    file="tokenizer_config.json", variant="mistral", gen_eos=["</s>"], system="refused"),
    # Qwen3's <think> and </think> are added tokens that are not special (decoded text keeps them)
    "qwen3": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], added=["<think>", "</think>"], bos=None,
                  eos="<|im_end|>", template=QWEN3_TEMPLATE, file="tokenizer_config.json", variant="qwen3",
                  gen_eos=["<|im_end|>", "<|endoftext|>"], system="turn"),
    "gemma2": dict(specials=GEMMA_SPECIALS, bos="<bos>", eos="<eos>", template=GEMMA2_TEMPLATE,
                   file="tokenizer_config.json", variant="gemma2", gen_eos=["<eos>", "<end_of_turn>"],
                   system="refused"),
    "gemma3": dict(specials=GEMMA_SPECIALS, bos="<bos>", eos="<eos>", template=GEMMA3_TEMPLATE,
                   file="tokenizer_config.json", variant="gemma3", gen_eos=["<eos>", "<end_of_turn>"],
                   system="folded"),
    # Phi-3.5-mini's <s> is its BOS, but its template writes none, so no chat prompt holds one
    "phi3": dict(specials=["<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>",
                           "<|user|>"], bos=None, eos="<|endoftext|>", template=PHI3_TEMPLATE,
                 file="tokenizer_config.json", variant="phi3", gen_eos=["<|end|>", "<|assistant|>", "<|endoftext|>"],
                 system="turn"),
    # with no system message SmolLM3's header holds its long default instructions (~1,100 tokens here)
    "smollm3": dict(specials=["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"], bos=None,
                    eos="<|im_end|>", template=SMOLLM3_TEMPLATE, file="chat_template.jinja", variant="smollm3",
                    gen_eos=["<|im_end|>"], system="turn", max_positions=2048),
}
# each style's end-of-turn token: the one its template closes a turn with and generation stops on
END_OF_TURN = {"llama3": "<|eot_id|>", "qwen2": "<|im_end|>", "mistral": "</s>", "qwen3": "<|im_end|>",
               "gemma2": "<end_of_turn>", "gemma3": "<end_of_turn>", "phi3": "<|end|>", "smollm3": "<|im_end|>"}
CHAT_STYLES = tuple(STYLES)


def make_chat_tokenizer(out: Path, style: str):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    s = STYLES[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=s["specials"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TEXT + "[INST] user assistant system You are a helpful assistant. [/INST]"], trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in s.get("added", [])])
    if s["bos"]:  # like Llama 3 and Mistral, plain text is tokenized with a leading BOS
        tok.post_processor = processors.TemplateProcessing(
            single=f"{s['bos']} $A", pair=f"{s['bos']} $A {s['bos']} $B", special_tokens=[(s["bos"], tok.token_to_id(s["bos"]))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=s["bos"], eos_token=s["eos"], pad_token=s["eos"])
    fast.save_pretrained(out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    if s["file"] == "chat_template.jinja":
        (out / "chat_template.jinja").write_text(s["template"])
    else:
        path = out / "tokenizer_config.json"
        cfg = json.loads(path.read_text())
        cfg["chat_template"] = s["template"]
        path.write_text(json.dumps(cfg, indent=2))
    return fast


def make_chat_checkpoint(out: Path, style: str, seed: int = 0) -> Path:
    """A random-weight checkpoint of `style` (a key of STYLES) with its chat template, on its family's variant."""
    from jobs.bench.models import save_random_model

    s = STYLES[style]
    out.mkdir(parents=True, exist_ok=True)
    tok = make_chat_tokenizer(out, style)
    config = family_config if s["variant"] in FAMILY_VARIANTS else llama_config
    cfg = config(len(tok), s["variant"])
    cfg.max_position_embeddings = s.get("max_positions", cfg.max_position_embeddings)
    cfg.bos_token_id = tok.bos_token_id
    cfg.eos_token_id = tok.eos_token_id
    save_random_model(out, cfg, torch.float32, seed, adjust=lambda model: perturb_norms(model, seed))
    set_generation_eos(out, [tok.convert_tokens_to_ids(t) for t in s["gen_eos"]])
    return out


def set_generation_eos(model_dir: Path, eos_ids: list[int]) -> None:
    """Write `eos_ids` as generation_config.json's eos_token_id (the ids `generate` stops on)."""
    path = model_dir / "generation_config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    cfg["eos_token_id"] = eos_ids
    path.write_text(json.dumps(cfg, indent=2))
