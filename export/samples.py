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
        except json.JSONDecodeError as e:
            if line[0] == "{":  # a request body gone wrong, not text: calibrating on its characters would mislead
                raise CalibrationError(
                    f"{where}: not valid JSON ({e.msg}); a line starting with '{{' is read as a request body"
                ) from None
            found["sentences"].append(line)  # text that happens to start with a bracket or a quote
            continue
        if not isinstance(item, dict):
            text_or_pair(item, where)
        elif "question" in item and "context" in item:
            found["pairs"].append((str(item["question"]), str(item["context"])))
        elif "query" in item and ("texts" in item or "documents" in item):
            texts = item.get("texts", item.get("documents"))
            if not isinstance(texts, list) or len(texts) < 2 or not all(isinstance(t, str) for t in texts):
                raise CalibrationError(f"{where}: 'texts' must be a list of at least 2 texts to rank")
            found["groups"].append([(str(item["query"]), t) for t in texts])
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


# Calibration only (export/sensitivity.py), never parity: what the int8 search must see move. Entity-dense news
# sentences (ner spans are what moves first under int8) and paragraph-long contexts with several questions each
# (a long context has many near-best start and end positions; the short pairs above have one clear answer).
CALIBRATION_SENTENCES: tuple[str, ...] = (
    "Germany's Chancellor Olaf Scholz flew to Washington on Friday to meet President Joe Biden at the White House.",
    "Real Madrid beat Bayern Munich 2-1 at the Santiago Bernabeu, with Vinicius Junior scoring the winner.",
    "Shares of Toyota Motor Corp fell 3 percent in Tokyo after the Nikkei reported weaker exports to China.",
    "The United Nations Security Council met in New York to discuss the ceasefire between Israel and Hamas.",
    "Novak Djokovic defeated Carlos Alcaraz in straight sets to win the Australian Open in Melbourne.",
    "Reuters reported that Siemens AG will cut 2,000 jobs at its plants in Erlangen and Nuremberg.",
    "Former Prime Minister Boris Johnson told the BBC that the Conservative Party must unite behind Rishi Sunak.",
    "Police in Lyon arrested two men suspected of robbing a branch of Credit Agricole on Rue de la Republique.",
    "Manchester City manager Pep Guardiola praised Erling Haaland after the Norwegian scored a hat-trick against Fulham.",
    "The European Central Bank, led by Christine Lagarde, left interest rates unchanged at its meeting in Frankfurt.",
    "Microsoft and OpenAI announced a partnership with the University of Cambridge on Tuesday.",
    "Brazilian President Luiz Inacio Lula da Silva visited Beijing, where he met Xi Jinping and Li Qiang.",
    "AC Milan striker Olivier Giroud left for Los Angeles FC after six seasons in Serie A.",
    "The Kenyan runner Eliud Kipchoge finished tenth in the Boston Marathon, won by Evans Chebet.",
    "Amnesty International accused the government of Myanmar of detaining journalists in Yangon and Mandalay.",
    "Indian Prime Minister Narendra Modi opened the new parliament building in New Delhi on Sunday.",
    "BASF and Bayer said the Federal Cartel Office in Bonn had approved the sale of their joint venture.",
    "The Dutch cyclist Mathieu van der Poel won Paris-Roubaix ahead of Wout van Aert of Belgium.",
    "Nigeria's central bank governor Godwin Emefiele was suspended by President Bola Tinubu in Abuja.",
    "Airbus delivered its first A321XLR to Iberia at Toulouse, beating Boeing's timetable for the 737 MAX 10.",
    "New Zealand captain Kane Williamson scored a century against Pakistan at the Basin Reserve in Wellington.",
    "The World Health Organization said Tedros Adhanom Ghebreyesus would travel to Kinshasa and Kigali next week.",
    "Goldman Sachs, JPMorgan Chase and Morgan Stanley reported higher profits on Wall Street on Monday.",
    "Serena Williams watched from the stands at Flushing Meadows as Coco Gauff won the US Open.",
)

CALIBRATION_QA: tuple[tuple[str, str], ...] = tuple(
    (question, context)
    for context, questions in (
        (
            "The Hanseatic League was a commercial and defensive confederation of merchant guilds and market towns in "
            "Central and Northern Europe. Growing from a few North German towns in the late 12th century, the League "
            "came to dominate Baltic maritime trade for three centuries along the coasts of Northern Europe. Its main "
            "city was Lubeck, where the first general diet met in 1356. The League had offices, called Kontore, in "
            "Bruges, Bergen, Novgorod and London, where its base was the Steelyard on the Thames. It declined after "
            "1450 as the Dutch, the English and the rising territorial states took over its trade, and the last diet "
            "met in 1669, attended by only nine cities.",
            (
                "What was the main city of the Hanseatic League?",
                "When did the first general diet meet?",
                "What was the League's base in London called?",
                "How many cities attended the last diet?",
            ),
        ),
        (
            "Photosynthesis is the process by which plants, algae and some bacteria turn light energy into chemical "
            "energy. In plants it takes place in the chloroplasts, mainly in the leaves, where the pigment chlorophyll "
            "absorbs red and blue light and reflects green, which is why leaves look green. The light-dependent "
            "reactions split water and release oxygen as a by-product, while the Calvin cycle, which does not need "
            "light directly, fixes carbon dioxide from the air into sugars. About 90 percent of the oxygen in the "
            "atmosphere is thought to have come from photosynthesis over some 2.4 billion years, beginning with "
            "cyanobacteria in the ancient oceans.",
            (
                "Where does photosynthesis take place in plants?",
                "Why do leaves look green?",
                "What does the Calvin cycle fix into sugars?",
                "Which organisms began producing oxygen?",
            ),
        ),
        (
            "The Transcontinental Railroad in the United States was completed on May 10, 1869, when the Central "
            "Pacific and the Union Pacific lines met at Promontory Summit in the Utah Territory. Leland Stanford, "
            "president of the Central Pacific and a former governor of California, drove the ceremonial golden spike. "
            "The Central Pacific had built eastward from Sacramento across the Sierra Nevada, largely with Chinese "
            "workers, while the Union Pacific built westward from Council Bluffs, Iowa, with many Irish immigrants and "
            "Civil War veterans. The journey from New York to San Francisco fell from several months to about a week.",
            (
                "When was the Transcontinental Railroad completed?",
                "Who drove the golden spike?",
                "Where did the Union Pacific start building?",
                "How long did the journey from New York to San Francisco take afterwards?",
            ),
        ),
        (
            "Marie Curie was born Maria Sklodowska in Warsaw in 1867. She moved to Paris in 1891 to study physics and "
            "mathematics at the Sorbonne, where she met the physicist Pierre Curie, whom she married in 1895. Together "
            "they discovered two new elements, polonium, named after her native Poland, and radium. In 1903 she shared "
            "the Nobel Prize in Physics with Pierre Curie and Henri Becquerel, and in 1911 she won the Nobel Prize in "
            "Chemistry alone, becoming the first person to win Nobel Prizes in two sciences. She died in 1934 of "
            "aplastic anaemia, probably caused by her long exposure to radiation.",
            (
                "Where was Marie Curie born?",
                "Which element was named after Poland?",
                "Who shared the 1903 Nobel Prize in Physics with her?",
                "What did she die of?",
            ),
        ),
        (
            "The Amazon River in South America is the largest river in the world by the volume of water it carries, "
            "about 209,000 cubic metres per second, more than the next seven largest rivers combined. Its source has "
            "long been disputed; a 2014 study placed it at the Mantaro River in Peru. The river flows east through "
            "Peru, Colombia and Brazil before reaching the Atlantic Ocean near the city of Belem. No bridge crosses "
            "the main river, because most of its length runs through rainforest with few roads and the banks shift "
            "from season to season. The Amazon basin covers some seven million square kilometres.",
            (
                "How much water does the Amazon carry?",
                "Where did a 2014 study place the source of the Amazon?",
                "Why does no bridge cross the Amazon?",
                "Near which city does the Amazon reach the Atlantic?",
            ),
        ),
        (
            "The Apollo 11 mission launched from Kennedy Space Center in Florida on July 16, 1969, carrying Neil "
            "Armstrong, Buzz Aldrin and Michael Collins. Four days later the lunar module Eagle landed in the Sea of "
            "Tranquility, while Collins stayed in lunar orbit aboard the command module Columbia. Armstrong stepped "
            "onto the surface six and a half hours after landing, and the two astronauts spent about two and a quarter "
            "hours outside, collecting 21.5 kilograms of lunar material. The crew splashed down in the Pacific Ocean "
            "on July 24 and were recovered by the aircraft carrier USS Hornet.",
            (
                "Who stayed in lunar orbit?",
                "Where did the lunar module land?",
                "How much lunar material did the astronauts collect?",
                "Which ship recovered the crew?",
            ),
        ),
    )
    for question in questions
)
