#!/usr/bin/env python3
"""What a vLLM user's openai client meets on a running `sparkrt serve`.

Usage: openai_vllm_check.py BASE_URL [API_KEY]

Checks vLLM's `stream_options.continuous_usage_stats` (every chunk carries
its choice's running usage, ending at the final usage chunk's counts, which
equal the blocking answer's), and that an unknown nested key comes back as
the client's BadRequestError naming its JSON path. Prints one line per
check and exits non-zero on the first failure.
"""

import sys

import openai


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def continuous_usage(client, model, create, what):
    blocking = create(stream=False)
    chunks = list(
        create(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    )
    check(len(chunks) >= 3, f"{what}: several chunks ({len(chunks)})")
    check(all(c.usage is not None for c in chunks), f"{what}: every chunk carries usage")
    final = chunks[-1]
    check(not final.choices, f"{what}: the last chunk is the usage chunk")
    check(
        final.usage.prompt_tokens == blocking.usage.prompt_tokens
        and final.usage.completion_tokens == blocking.usage.completion_tokens,
        f"{what}: final usage {final.usage} equals the blocking answer's {blocking.usage}",
    )
    running = [c.usage for c in chunks[:-1]]
    counts = [u.completion_tokens for u in running]
    check(counts == sorted(counts), f"{what}: completion tokens never go down: {counts}")
    check(
        counts[-1] == blocking.usage.completion_tokens,
        f"{what}: the running count ends at the answer's ({counts[-1]})",
    )
    check(
        all(u.prompt_tokens == blocking.usage.prompt_tokens for u in running),
        f"{what}: every chunk counts the whole prompt",
    )
    check(
        all(u.total_tokens == u.prompt_tokens + u.completion_tokens for u in running),
        f"{what}: running totals add up",
    )
    plain = list(create(stream=True, stream_options={"include_usage": True}))
    check(
        all(c.usage is None for c in plain[:-1]) and plain[-1].usage is not None,
        f"{what}: without continuous_usage_stats only the last chunk has usage",
    )


def refused(create, path, **kwargs):
    try:
        create(**kwargs)
    except openai.BadRequestError as e:
        body = e.body or {}
        check(
            body.get("param") == path and body.get("code") == "unsupported_parameter",
            f"{path} refused by path: {body}",
        )
        return
    raise SystemExit(f"FAILED: {path} was accepted")


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    base_url = sys.argv[1].rstrip("/") + "/v1"
    api_key = sys.argv[2] if len(sys.argv) == 3 else "unused"
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)
    model = client.models.list().data[0].id

    def completion(**kwargs):
        return client.completions.create(
            model=model, prompt="Hello there, how are you", max_tokens=6, temperature=0, **kwargs
        )

    def chat(**kwargs):
        return client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=6,
            temperature=0,
            **kwargs,
        )

    continuous_usage(client, model, completion, "completions")
    continuous_usage(client, model, chat, "chat")

    refused(chat, "stream_options.foo", stream=True, stream_options={"include_usage": True, "foo": 1})
    refused(
        chat,
        "response_format.json_schema.bar",
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "bar": 1}},
    )
    refused(
        chat,
        "tools[0].function.baz",
        tools=[{"type": "function", "function": {"name": "f", "baz": 1}}],
    )
    print("openai vllm check passed")


if __name__ == "__main__":
    main()
