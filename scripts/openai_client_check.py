#!/usr/bin/env python3
"""Talks to a running `sparkrt serve` with the official `openai` client.

Usage: openai_client_check.py BASE_URL [API_KEY]

BASE_URL is the server's root (http://127.0.0.1:PORT); the client is pointed
at BASE_URL/v1. Checks models, completions and chat completions, blocking and
streamed, that both ways give the same greedy text, that usage adds up, that
n = 2 gives two indexed choices (and the same ones streamed), and
that errors come back as the client's typed exceptions. Prints one line per
check and exits non-zero on the first failure.
"""

import sys

import openai


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    base_url = sys.argv[1].rstrip("/") + "/v1"
    api_key = sys.argv[2] if len(sys.argv) == 3 else "unused"
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=300)

    models = client.models.list()
    names = [m.id for m in models.data]
    check(len(names) == 1, f"one model served: {names}")
    model = names[0]

    # Completions, blocking and streamed: greedy, so both give the same text.
    prompt = "Hello there, how are you"
    blocking = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
    choice = blocking.choices[0]
    check(choice.finish_reason == "length", f"completion ends at max_tokens: {choice.finish_reason}")
    check(blocking.usage.completion_tokens == 12, f"12 completion tokens: {blocking.usage}")
    check(
        blocking.usage.total_tokens
        == blocking.usage.prompt_tokens + blocking.usage.completion_tokens,
        "usage adds up",
    )
    streamed_text = ""
    finish = None
    usage = None
    for chunk in client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.choices:
            streamed_text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    check(streamed_text == choice.text, "streamed completion text equals the blocking one")
    check(finish == "length", f"streamed completion finish reason: {finish}")
    check(usage is not None and usage.completion_tokens == 12, f"streamed usage: {usage}")

    # Chat, blocking and streamed.
    messages = [{"role": "user", "content": "Hello"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0)
    message = chat.choices[0].message
    check(message.role == "assistant", f"chat answer from the assistant: {message.role}")
    check(chat.usage.completion_tokens == 10, f"10 chat completion tokens: {chat.usage}")
    streamed_text = ""
    roles = []
    finish = None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=10, temperature=0, stream=True
    ):
        delta = chunk.choices[0].delta
        if delta.role:
            roles.append(delta.role)
        streamed_text += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    check(roles == ["assistant"], f"the role comes once: {roles}")
    check(streamed_text == message.content, "streamed chat text equals the blocking one")
    check(finish == "length", f"streamed chat finish reason: {finish}")

    # Log-probabilities in OpenAI's shapes, read through the client's types.
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    check(len(content) == chat.usage.completion_tokens, f"one logprob per chat token: {len(content)}")
    for entry in content:
        top = entry.top_logprobs
        check(len(top) == 3, f"3 alternatives: {top}")
        check(
            all(a.logprob >= b.logprob for a, b in zip(top, top[1:])),
            "alternatives most likely first",
        )
        check(top[0].logprob == entry.logprob, "greedy token is the top-1")
        check(bytes(entry.bytes) == entry.token.encode(), "bytes are the token's UTF-8")
    completion = client.completions.create(
        model=model, prompt=prompt, max_tokens=1, temperature=0, logprobs=2, echo=True
    )
    lp = completion.choices[0].logprobs
    check(lp.token_logprobs[0] is None, "echo: the first prompt token has no logprob")
    check(
        len(lp.tokens) == completion.usage.prompt_tokens + 1,
        f"echo: prompt and generated tokens: {len(lp.tokens)}",
    )
    check(completion.choices[0].text.startswith(prompt), "echo: the prompt is prepended")
    check(all(len(t) <= 2 for t in lp.top_logprobs[1:]), "at most 2 alternatives")
    batch = client.completions.create(model=model, prompt=[prompt, "Hi"], max_tokens=3, temperature=0)
    check([c.index for c in batch.choices] == [0, 1], "a batch of prompts gives a choice each")

    # n = 2: two choices, each with its index, read through the client's types.
    two = client.completions.create(
        model=model, prompt=prompt, max_tokens=4, n=2, seed=3, extra_body={"ignore_eos": True}
    )
    check([c.index for c in two.choices] == [0, 1], f"n=2 completions: indexes {two.choices}")
    check(two.usage.completion_tokens == 8, f"n=2: the choices' tokens are summed: {two.usage}")
    chat_two = client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, n=2, seed=3
    )
    check([c.index for c in chat_two.choices] == [0, 1], "n=2 chat: indexes 0, 1")
    check(
        all(c.message.role == "assistant" for c in chat_two.choices),
        "n=2 chat: every choice is an assistant message",
    )
    streamed = {}
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, n=2, seed=3, stream=True
    ):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    check(
        [streamed.get(c.index) for c in chat_two.choices]
        == [c.message.content or "" for c in chat_two.choices],
        f"n=2 chat streamed per index equals the blocking choices: {streamed}",
    )

    # Errors arrive as the client's typed exceptions.
    try:
        client.completions.create(model="no-such-model", prompt=prompt, max_tokens=2)
        check(False, "an unknown model is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "an unknown model is a NotFoundError")
    try:
        client.completions.create(model=model, prompt=prompt, max_tokens=-1)
        check(False, "negative max_tokens is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400, "negative max_tokens is a BadRequestError")
    print("openai client check passed")


if __name__ == "__main__":
    main()
