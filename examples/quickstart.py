"""The Python SDK against a running server (`make serve` in another terminal): one call per endpoint.

pip install ./clients          # (make serve / make test install it into .venv already)
python examples/quickstart.py  # BERTSERVE_BASE_URL=http://host:port for a server elsewhere
"""

from bertserve_client import Client

with Client() as client:  # http://127.0.0.1:8000, or $BERTSERVE_BASE_URL; api_key=... if the server has one
    print(client.info().tasks)

    print(client.classify("I loved this film."))
    for labels in client.classify(["A gripping, beautifully shot film.", "A dull, lifeless script."]):
        print(labels[0].label, round(labels[0].score, 3))

    for entity in client.ner("Angela Merkel met Emmanuel Macron in Paris."):
        print(entity.label, repr(entity.word), entity.start, entity.end)

    context = (
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
        "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
    )
    answer = client.qa("Who is the tower named after?", context)
    print(answer.answer, round(answer.score, 3), context[answer.start : answer.end] == answer.answer)

    vectors = client.embed(["A man is eating food.", "Someone is eating a meal.", "The stock market fell."])
    similarity = [sum(a * b for a, b in zip(vectors[0], other)) for other in vectors[1:]]
    print(len(vectors[0]), [round(s, 3) for s in similarity])  # unit vectors: dot product = cosine
