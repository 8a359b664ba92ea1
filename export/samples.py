"""Fixed text that every export is verified on: real sentences, so parity covers real token ids,
real lengths and real padding, not random ids. Shipped with the code; nothing is read at run time.
"""

from __future__ import annotations

# Varied length, casing, punctuation, numbers, names and non-ASCII, in batches so rows get padded.
SENTENCES: tuple[str, ...] = (
    "The movie was absolutely wonderful, and the cast was perfect.",
    "I hated every minute of it.",
    "An ambitious, sprawling, and ultimately hollow piece of filmmaking that mistakes length for depth.",
    "Not bad.",
    "It's a charming and often affecting journey.",
    "The plot makes no sense whatsoever, yet somehow I could not look away.",
    "Angela Merkel met Emmanuel Macron in Berlin on Tuesday to discuss the EU budget.",
    "Apple Inc. reported revenue of $89.5 billion for the quarter ending in September.",
    "The Eiffel Tower, completed in 1889, is 330 metres tall.",
    "Dr. Smith's clinic on 5th Avenue opens at 9:30 a.m.",
    "Crème brûlée and café au lait at the Zürich Hauptbahnhof — très chic!",
    "ok",
    "Why does the rain in Spain stay mainly in the plain?",
    "This is, without a doubt, the single most tedious, overlong and self-indulgent film I have "
    "sat through in years; the dialogue is wooden, the pacing glacial and the ending insulting.",
    "A gorgeous, witty, seductive movie.",
    "The Manchester United striker scored twice before half-time at Old Trafford.",
    "Water boils at 100 degrees Celsius at sea level.",
    'She said "no" (twice) and left.',
    "Tokyo, Osaka and Kyoto are cities in Japan.",
    "if you've ever wondered what a slow-motion car crash looks like, here it is.",
    "The committee will reconvene next Thursday after reviewing the proposals.",
    "Barack Obama was born in Honolulu, Hawaii.",
    "unremarkable , but not unpleasant",
    "The quick brown fox jumps over the lazy dog.",
)

# (question, context) pairs: two segments, so token_type_ids are exercised.
QUESTION_CONTEXTS: tuple[tuple[str, str], ...] = (
    (
        "Where was Barack Obama born?",
        "Barack Obama was born in Honolulu, Hawaii, and later studied at Columbia University.",
    ),
    ("How tall is the Eiffel Tower?", "The Eiffel Tower, completed in 1889 for the World's Fair, is 330 metres tall."),
    ("When does the clinic open?", "Dr. Smith's clinic on 5th Avenue opens at 9:30 a.m. on weekdays."),
    (
        "What did Apple report?",
        "Apple Inc. reported revenue of $89.5 billion for the quarter ending in September, "
        "down one percent from a year earlier.",
    ),
    ("Who scored?", "The Manchester United striker scored twice before half-time at Old Trafford."),
    ("At what temperature does water boil?", "Water boils at 100 degrees Celsius at sea level."),
    ("Which cities are mentioned?", "Tokyo, Osaka and Kyoto are cities in Japan."),
    ("What did she say?", 'She said "no" (twice) and left.'),
)

# Queries each ranked against every context above (rerank's calibration), and zero-shot's candidate labels.
ZERO_SHOT_LABELS: tuple[str, ...] = ("politics", "sports", "science", "film", "business")
ZERO_SHOT_TEMPLATE = "This example is {}."


class CalibrationError(ValueError):
    """A --calibration file that cannot be read as any task's input."""


def read_calibration(path, limit: int = 512) -> dict[str, list]:
    """A calibration file, one input a line, in any task's input format: plain text; a JSON string or
    [text, text_pair]; or a JSON request body: {"inputs": text | [text, pair] | [...]} (classify, ner, embed,
    fill-mask, zero-shot with "candidate_labels"), {"question", "context"} (qa), {"query", "texts" | "documents"}
    (rerank). Returns {"sentences": [str], "pairs": [(a, b)], "groups": [[(a, b), ...]]}, at most `limit` each."""
    import json
    from pathlib import Path

    found: dict[str, list] = {"sentences": [], "pairs": [], "groups": []}

    def text_or_pair(item, where):
        if isinstance(item, str):
            found["sentences"].append(item)
        elif isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            found["pairs"].append(tuple(item))
        else:
            raise CalibrationError(f"{where}: expected a text or a [text, text_pair] pair, got {str(item)[:80]}")

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CalibrationError(f"cannot read --calibration {path}: {getattr(e, 'strerror', None) or e}") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        where = f"{path}:{number}"
        if not line:
            continue
        if line[0] not in '{["':
            found["sentences"].append(line)
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            found["sentences"].append(line)  # text that happens to start with a bracket or a quote
            continue
        if not isinstance(item, dict):
            text_or_pair(item, where)
        elif "question" in item and "context" in item:
            found["pairs"].append((str(item["question"]), str(item["context"])))
        elif "query" in item and ("texts" in item or "documents" in item):
            texts = item.get("texts", item.get("documents"))
            found["groups"].append([(str(item["query"]), str(t)) for t in texts])
        elif "inputs" in item:
            inputs = item["inputs"]
            if item.get("candidate_labels"):
                template = item.get("hypothesis_template") or ZERO_SHOT_TEMPLATE
                texts = inputs if isinstance(inputs, list) else [inputs]
                for text in texts:
                    found["groups"].append([(str(text), template.format(label)) for label in item["candidate_labels"]])
                continue
            items = inputs if isinstance(inputs, list) else [inputs]  # [str] is texts, [[str, str]] pairs
            for one in items:
                text_or_pair(one, where)
        else:
            raise CalibrationError(
                f"{where}: a JSON object needs 'inputs', 'question' and 'context', or 'query' and 'texts'"
            )
    return {kind: values[:limit] for kind, values in found.items()}
