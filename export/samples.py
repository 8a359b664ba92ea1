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
