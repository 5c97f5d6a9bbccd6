//! The sampling fields and structured outputs over HTTP, on both routes:
//! out-of-range values are a 400 naming the field; stop tokens, min_tokens,
//! include_stop_str_in_output and logit_bias do what their definitions say
//! on greedy runs (whose unconstrained answer the test reads first);
//! constrained outputs follow their grammar; the official client and
//! `jsonschema` check the JSON schemas (scripts/structured_output_check.py).

use serde_json::{Value, json};

use crate::common;
use crate::server::{Server, ids, repo};

const PROMPT: &str = "Hello there, how are you";
/// Greedy ends with the end-of-sequence token after 84 tokens.
const PROMPT_ENDING: &str = "Tell me a story";

fn completion(server: &Server, body: Value) -> Value {
    let reply = server.post("/v1/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()["choices"][0].clone()
}

fn chat_body(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn out_of_range_values_are_a_400_naming_the_field_on_both_routes() {
    let server = Server::start(&[]);
    let cases = [
        ("presence_penalty", json!(2.5)),
        ("presence_penalty", json!(-2.01)),
        ("frequency_penalty", json!(9)),
        ("repetition_penalty", json!(0)),
        ("repetition_penalty", json!(-1)),
        ("min_p", json!(2)),
        ("min_p", json!(-0.1)),
        ("temperature", json!(2.5)),
        ("temperature", json!(-1)),
        ("top_p", json!(0)),
        ("top_p", json!(1.5)),
        ("logit_bias", json!({"5": 101})),
        ("logit_bias", json!({"5": -100.5})),
        ("logit_bias", json!({"not-an-id": 1})),
        ("logit_bias", json!({"99999": 1})),
        ("stop_token_ids", json!([99999])),
        ("min_tokens", json!(-1)),
        ("min_tokens", json!(9)),
        ("best_of", json!(0)),
        ("response_format", json!({"type": "bogus"})),
        ("response_format", json!({"type": "json_schema"})),
        (
            "response_format",
            json!({"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}),
        ),
        // Grammars that compile but admit no output at all: refused up
        // front, not failed in the engine as a 500.
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}),
        ),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x",
                "schema": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}}),
        ),
        ("guided_regex", json!("[^\\s\\S]")),
        ("guided_regex", json!("(unclosed")),
        ("guided_grammar", json!("start: undefined_rule")),
        ("guided_json", json!("{not json")),
        ("guided_choice", json!([])),
        ("structured_outputs", json!({"regex": "a", "choice": ["b"]})),
        (
            "structured_outputs.whitespace_pattern",
            json!({"whitespace_pattern": " "}),
        ),
    ];
    for (field, value) in cases {
        let top_field = field.split('.').next().unwrap();
        let nested = field.contains('.');
        let mut completion = json!({"prompt": PROMPT, "max_tokens": 8});
        let mut chat = chat_body(json!({}));
        if nested {
            completion["structured_outputs"] = value.clone();
            chat["structured_outputs"] = value.clone();
        } else {
            completion[top_field] = value.clone();
            chat[top_field] = value.clone();
        }
        for (route, body) in [
            ("/v1/completions", completion),
            ("/v1/chat/completions", chat),
        ] {
            let error = server.post(route, &body).assert_error(400);
            assert_eq!(error["param"], field, "{route} {field} = {value}: {error}");
        }
    }
    // Two structured-output forms at once are refused.
    let both = json!({"prompt": PROMPT, "guided_regex": "a+", "guided_choice": ["a"]});
    let error = server.post("/v1/completions", &both).assert_error(400);
    assert!(
        error["message"].as_str().unwrap().contains("only one"),
        "{error}"
    );
    // In-range values and the defaults' spellings are accepted.
    let fine = json!({"prompt": PROMPT, "max_tokens": 4, "presence_penalty": -2,
        "frequency_penalty": 2, "repetition_penalty": 1.2, "min_p": 1, "temperature": 2,
        "logit_bias": {"5": 100, "6": -100}, "best_of": 1, "min_tokens": 4,
        "stop_token_ids": [], "include_stop_str_in_output": false,
        "response_format": {"type": "text"}});
    assert_eq!(server.post("/v1/completions", &fine).status, 200);
}

#[test]
fn stop_tokens_min_tokens_logit_bias_and_stop_strings_on_greedy_runs() {
    let server = Server::start(&[]);
    let greedy = |extra: Value| {
        let mut body = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                              "return_token_ids": true});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        completion(&server, body)
    };
    let plain = greedy(json!({}));
    let tokens = ids(&plain["token_ids"]);
    let text = plain["text"].as_str().unwrap().to_string();

    // stop_token_ids: ends before the first occurrence of the 4th token.
    let stop = tokens[3];
    let first = tokens.iter().position(|&t| t == stop).unwrap();
    let stopped = greedy(json!({"stop_token_ids": [stop]}));
    assert_eq!(stopped["finish_reason"], "stop");
    assert_eq!(ids(&stopped["token_ids"]), tokens[..first]);
    // ... and with include_stop_str_in_output the stop token is in it.
    let included = greedy(json!({"stop_token_ids": [stop], "include_stop_str_in_output": true}));
    assert_eq!(ids(&included["token_ids"]), tokens[..=first]);

    // A stop string from the middle of the text: cut before it, or after it
    // when it is to be included.
    let chars: Vec<char> = text.chars().collect();
    let stop_string: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let at = text.find(&stop_string).unwrap();
    let cut = greedy(json!({"stop": stop_string}));
    assert_eq!(cut["text"], text[..at], "stop string {stop_string:?}");
    let kept = greedy(json!({"stop": stop_string, "include_stop_str_in_output": true}));
    assert_eq!(
        kept["text"],
        text[..at + stop_string.len()],
        "stop string {stop_string:?}"
    );

    // logit_bias of +100 on one token: greedy picks it every time.
    let favourite = tokens[5];
    let biased = greedy(json!({"logit_bias": {favourite.to_string(): 100}}));
    assert_eq!(ids(&biased["token_ids"]), vec![favourite; 24]);
    // -100 on the first greedy token: it never comes first.
    let banned = greedy(json!({"logit_bias": {tokens[0].to_string(): -100}}));
    assert_ne!(ids(&banned["token_ids"])[0], tokens[0]);

    // min_tokens: the run that ends with end-of-sequence after 84 tokens
    // goes on to 90 when end-of-sequence is masked that long.
    let ending = completion(
        &server,
        json!({"prompt": PROMPT_ENDING, "max_tokens": 200, "temperature": 0}),
    );
    assert_eq!(ending["finish_reason"], "stop");
    let reply = server.post(
        "/v1/completions",
        &json!({"prompt": PROMPT_ENDING, "max_tokens": 120, "temperature": 0,
                "min_tokens": 100}),
    );
    let body = reply.json();
    assert!(
        body["usage"]["completion_tokens"].as_u64().unwrap() >= 100,
        "{body}"
    );
}

/// A constrained request's text and finish reason.
fn constrained(server: &Server, route: &str, extra: Value, seed: u64) -> (String, String) {
    let mut body = if route == "/v1/completions" {
        json!({"prompt": PROMPT})
    } else {
        chat_body(json!({}))
    };
    body["max_tokens"] = json!(300);
    body["temperature"] = json!(1);
    body["seed"] = json!(seed);
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let reply = server.post(route, &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let choice = &reply.json()["choices"][0];
    let text = if route == "/v1/completions" {
        choice["text"].as_str().unwrap().to_string()
    } else {
        choice["message"]["content"].as_str().unwrap().to_string()
    };
    (text, choice["finish_reason"].as_str().unwrap().to_string())
}

#[test]
fn choices_regexes_and_grammars_constrain_the_output() {
    let server = Server::start(&[]);
    // Metacharacters in a choice stand for themselves.
    let choices = ["yes", "no", "maybe later", "a/b.c(d)\"e|f*"];
    for route in ["/v1/completions", "/v1/chat/completions"] {
        for seed in 0..10 {
            for extra in [
                json!({"guided_choice": choices}),
                json!({"structured_outputs": {"choice": choices}}),
            ] {
                let (text, finish) = constrained(&server, route, extra, seed);
                assert!(choices.contains(&text.as_str()), "{route}: {text:?}");
                assert_eq!(finish, "stop");
            }
            // A regex as written: two to four digits, a dash, a lowercase word.
            let (text, finish) = constrained(
                &server,
                route,
                json!({"guided_regex": "[0-9]{2,4}-[a-z]{1,5}"}),
                seed,
            );
            let (digits, word) = text.split_once('-').unwrap_or(("", ""));
            assert!(
                (2..=4).contains(&digits.len())
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && (1..=5).contains(&word.len())
                    && word.bytes().all(|b| b.is_ascii_lowercase()),
                "{route}: {text:?} does not match"
            );
            assert_eq!(finish, "stop");
            // A Lark grammar.
            let (text, _) = constrained(
                &server,
                route,
                json!({"structured_outputs": {"grammar": "start: (\"ab\" | \"cd\") \"!\""}}),
                seed,
            );
            assert!(["ab!", "cd!"].contains(&text.as_str()), "{route}: {text:?}");
        }
    }
}

/// Batched prompts: each prompt's choice follows its own copy of the grammar.
#[test]
fn each_prompt_of_a_batch_follows_the_grammar() {
    let server = Server::start(&[]);
    let choices = ["red", "green", "blue"];
    let body = json!({"prompt": ["one", "two words", "three more words", "four"],
                      "guided_choice": choices, "temperature": 1, "seed": 3,
                      "max_tokens": 20});
    let reply = server.post("/v1/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer = reply.json();
    let texts: Vec<&str> = answer["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts.len(), 4);
    for text in texts {
        assert!(choices.contains(&text), "{text:?}");
    }
}

#[test]
fn json_outputs_parse_and_follow_the_schema() {
    let server = Server::start(&[]);
    let schema = json!({"type": "object",
        "properties": {"level": {"type": "integer", "minimum": 0, "maximum": 99},
                       "kind": {"enum": ["a", "b"]}},
        "required": ["level", "kind"], "additionalProperties": false});
    for route in ["/v1/completions", "/v1/chat/completions"] {
        for seed in 0..5 {
            let (text, finish) = constrained(
                &server,
                route,
                json!({"response_format": {"type": "json_schema",
                       "json_schema": {"name": "t", "schema": schema, "strict": true}}}),
                seed,
            );
            let value: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{route}: {text:?} is not JSON: {e}"));
            let level = value["level"].as_i64().unwrap();
            assert!((0..=99).contains(&level), "{text}");
            assert!(
                ["a", "b"].contains(&value["kind"].as_str().unwrap()),
                "{text}"
            );
            assert_eq!(value.as_object().unwrap().len(), 2, "{text}");
            assert_eq!(finish, "stop");
        }
    }
}

/// Why the Python check cannot run here, if it cannot.
fn missing_python_packages() -> Option<String> {
    common::missing_python_modules("openai, jsonschema")
}

/// 50 seeded samples per schema (nested objects, enums, arrays, required
/// fields, patterns) through the official client's `response_format`, each
/// validated by `jsonschema`; json_object, guided_choice and a regex too.
#[test]
fn the_official_client_gets_json_valid_against_each_schema() {
    if !common::tool_present("structured outputs check", missing_python_packages()) {
        return;
    }
    let server = Server::start(&[]);
    let stdout = server.run_script("structured_output_check.py", &[]);
    eprintln!("{stdout}");
    assert!(stdout.contains("all structured outputs valid"), "{stdout}");
}

/// One row of the README's table of request fields.
struct FieldRow {
    field: String,
    /// What completions and chat are sent for the field.
    examples: [Value; 2],
    /// Fields sent along where the field is supported (`with {...}`).
    along: Value,
    completions: String,
    chat: String,
}

fn readme_fields() -> Vec<FieldRow> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find("<!-- request-fields:start -->").unwrap();
    let end = readme.find("<!-- request-fields:end -->").unwrap();
    readme[start..end]
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let unquote = |cell: &str| cell.trim().trim_matches('`').to_string();
            let parse = |text: &str| -> Value {
                serde_json::from_str(&unquote(text))
                    .unwrap_or_else(|e| panic!("example {text} of {}: {e}", cells[1]))
            };
            let (examples, along) = match cells[2].split_once(" with ") {
                Some((examples, along)) => (examples, parse(along)),
                None => (cells[2], json!({})),
            };
            let examples = match examples.split_once(" / ") {
                Some((completions, chat)) => [parse(completions), parse(chat)],
                None => [parse(examples), parse(examples)],
            };
            FieldRow {
                field: unquote(cells[1]),
                examples,
                along,
                completions: cells[3].to_string(),
                chat: cells[4].to_string(),
            }
        })
        .collect()
}

/// The README's table says what each route does with each field: check it.
#[test]
fn the_readme_table_of_request_fields_holds() {
    let rows = readme_fields();
    assert!(rows.len() > 60, "the table has {} rows", rows.len());
    let server = Server::start(&[]);
    for row in &rows {
        for (route, status, example) in [
            ("/v1/completions", &row.completions, &row.examples[0]),
            ("/v1/chat/completions", &row.chat, &row.examples[1]),
        ] {
            let mut body = if route == "/v1/completions" {
                json!({"prompt": PROMPT})
            } else {
                chat_body(json!({}))
            };
            body["max_tokens"] = json!(2);
            body["temperature"] = json!(0);
            if status == "supported" {
                for (k, v) in row.along.as_object().unwrap() {
                    body[k] = v.clone();
                }
            }
            body[row.field.as_str()] = example.clone();
            let reply = server.post(route, &body);
            match status.as_str() {
                "supported" => assert_eq!(
                    reply.status, 200,
                    "{route}: `{}` is supported by the README: {}",
                    row.field, reply.body
                ),
                "refused" => {
                    let error = reply.assert_error(400);
                    assert_eq!(error["code"], "unsupported_parameter", "{route}: {error}");
                    assert_eq!(error["param"], row.field.as_str(), "{route}: {error}");
                }
                // Implemented on a branch being merged: flipped to
                // `supported` (and checked here) when it lands.
                "pending" => {}
                other => panic!("`{}`: unknown status {other:?}", row.field),
            }
        }
    }
}
