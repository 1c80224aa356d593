#!/usr/bin/env python3
"""Texts generated under a regular expression match it whole by Python's
re.fullmatch (what vLLM's guided_regex means), not by brisk's own reading of
it; texts generated under a GBNF grammar match an equivalent expression.

Trains a one-step byte-level GPT (its draws are close to uniform, so the
texts wander wherever a pattern lets them), generates a batch under each
pattern with `brisk generate --regex` (or `--grammar-file`), and checks
every text that ended (finish "stop": nothing more may follow). A pattern
brisk cannot enforce must be refused with exit code 2.
"""
import os
import re

from tiny_generate import die, generated, run, setup

# brisk's \d \w \s are ASCII (Python's re.ASCII); these patterns match the
# same texts either way.
PATTERNS = {
    "answer": r"(yes|no|maybe), [0-9]{1,3}(\.[0-9]{1,2})?!",
    "sentence": r"[A-Z][a-z]{1,6}( [a-z]{1,6}){0,3}\.",
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "pairs": r"(?P<key>[a-z_]{1,4})=(\"[^\"\n]{0,6}\"|-?\d{1,3})(;[a-z]{1,3}=\d){0,2}",
    "greek": r"[α-ω]{2,4} (é|ü|\x41){1,2}<.{1,3}>",
    "nullable": r"(a*)*b|(?:x|y?){2,3}\.",
    "python": r"^[a-z\-]{1,4}\_x{,2}\101\é$|^\d{2}$",
}

# GBNF grammars and the expressions that say the same.
GRAMMARS = {
    "list": ('root ::= item{1,3}\nitem ::= "- " [a-z ]{1,8} "\\n"\n', r"(- [a-z ]{1,8}\n){1,3}"),
    "call": ('root ::= name "(" (arg ("," arg)*)? ")"\nname ::= [a-z]{1,5}\narg ::= [0-9]{1,2} | "\\"" [a-z]{0,3} "\\""\n',
             r"[a-z]{1,5}\(((\d{1,2}|\"[a-z]{0,3}\")(,(\d{1,2}|\"[a-z]{0,3}\"))*)?\)"),
}

REFUSED = {
    ("--regex", "a(?=b)"): "lookaround",
    ("--regex", r"(a)\1"): "backreferences",
    ("--grammar", 'root ::= root "a" | "b"'): "left-recursive",
}


def main():
    a, run_dir = setup()
    prompt = "Answer:"
    cases = [(name, ["--regex", p], p) for name, p in PATTERNS.items()]
    for name, (grammar, equivalent) in GRAMMARS.items():
        path = os.path.join(a.workdir, name + ".gbnf")
        with open(path, "w") as f:
            f.write(grammar)
        cases.append((name, ["--grammar-file", path], equivalent))
    for name, flags, pattern in cases:
        r = run([a.brisk, "generate", "--checkpoint", run_dir, "--prompt", prompt, "--batch", str(a.batch),
                 "--no-stream", "--max-new", "80", "--temperature", "1", "--seed", "5", "--threads", "1"] + flags)
        ended = 0
        for i, (reason, text) in enumerate(generated(r, a.batch, prompt, name)):
            if reason != "stop":
                continue
            ended += 1
            if not re.fullmatch(pattern, text):
                die(f"{name}: text {i} does not match {pattern!r} whole: {text!r}")
        print(f"{name}: {ended} of {a.batch} texts ended, every one a whole match")
        if ended == 0:
            die(f"{name}: no text ended within 80 tokens; nothing was checked")
    for (flag, text), words in REFUSED.items():
        r = run([a.brisk, "generate", "--checkpoint", run_dir, "--prompt", prompt, flag, text])
        if r.returncode != 2 or words not in r.stderr:
            die(f"{flag} {text}: expected exit 2 naming {words!r}, got {r.returncode}: {r.stderr.strip()}")
    print("check_regex: ok")


if __name__ == "__main__":
    main()
