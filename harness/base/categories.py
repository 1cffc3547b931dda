"""Prompts by task category, written for this project (no benchmark's text): what users serve.

Whether speculation pays depends on the workload: prompt lookup gains most where the answer copies
the prompt (summaries, edits, answers from a document), a draft model least on translation. Each
category holds at least twelve prompts of its kind, phrased as the offline pair's users would send
them, each with the budget such an answer takes. ``CATEGORIES`` names them in the order
``--list-prompts`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Category:
    name: str
    what: str  # one line for --list-prompts
    new_tokens: int
    prompts: tuple[tuple[str, str], ...]  # (label, text)


# Signature + docstring to complete, 60-160 tokens each, like the seeds' CodeLlama decode prompts.
CODE_COMPLETION: tuple[tuple[str, str], ...] = (
    (
        "merge_intervals",
        '''\
def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals.

    The input may be unsorted. Intervals that touch, such as (1, 3) and (3, 5), are merged.
    Return the merged intervals sorted by their start.

    >>> merge_intervals([(5, 8), (1, 3), (2, 4)])
    [(1, 4), (5, 8)]
    """
''',
    ),
    (
        "parse_duration",
        '''\
def parse_duration(text: str) -> int:
    """Convert a duration such as "1h30m", "45s" or "2d4h" to a number of seconds.

    Units are d (days), h (hours), m (minutes) and s (seconds); each may appear at most once,
    in that order. Raise ValueError for anything else.

    >>> parse_duration("1h30m")
    5400
    """
''',
    ),
    (
        "rolling_mean",
        '''\
from collections.abc import Iterable, Iterator


def rolling_mean(values: Iterable[float], window: int) -> Iterator[float]:
    """Yield the mean of each full window of `window` consecutive values.

    Keep a running sum so each step costs O(1), and never hold more than `window` values.

    >>> list(rolling_mean([1, 2, 3, 4], 2))
    [1.5, 2.5, 3.5]
    """
''',
    ),
    (
        "slugify",
        '''\
import re
import unicodedata


def slugify(title: str, max_length: int = 50) -> str:
    """Turn a title into a lowercase URL slug.

    Strip accents, replace runs of non-alphanumeric characters with a single hyphen, trim
    hyphens from both ends and cut at a hyphen so the slug is at most `max_length` long.

    >>> slugify("Héllo, World!  2024")
    'hello-world-2024'
    """
''',
    ),
    (
        "topological_sort",
        '''\
def topological_sort(deps: dict[str, set[str]]) -> list[str]:
    """Order tasks so that every task comes after the tasks it depends on.

    `deps` maps a task to the set of tasks it needs. Tasks that only appear as dependencies
    are included too. Ties are broken alphabetically so the result is deterministic.
    Raise ValueError naming one task on a cycle if there is no valid order.
    """
''',
    ),
    (
        "chunked",
        '''\
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Split an iterable into lists of `size` items; the last list may be shorter.

    >>> list(chunked(range(7), 3))
    [[0, 1, 2], [3, 4, 5], [6]]
    """
''',
    ),
    (
        "levenshtein",
        '''\
def levenshtein(a: str, b: str) -> int:
    """Return the edit distance between two strings.

    Insertions, deletions and substitutions each cost 1. Use two rows of the dynamic
    programming table so memory is O(min(len(a), len(b))).

    >>> levenshtein("kitten", "sitting")
    3
    """
''',
    ),
    (
        "column_stats",
        '''\
import csv
import statistics
from pathlib import Path


def column_stats(path: Path, column: str) -> dict[str, float]:
    """Read a CSV file with a header row and summarise one numeric column.

    Return a dict with keys "count", "mean", "median", "min" and "max". Skip empty cells;
    raise KeyError if the column does not exist and ValueError if a cell is not a number.
    """
''',
    ),
    (
        "roman_to_int",
        '''\
def roman_to_int(numeral: str) -> int:
    """Convert a Roman numeral such as "MCMXCIV" to an integer.

    Accept upper or lower case. A smaller symbol before a larger one is subtracted.

    >>> roman_to_int("MCMXCIV")
    1994
    """
''',
    ),
    (
        "flatten_dict",
        '''\
from typing import Any


def flatten_dict(data: dict[str, Any], sep: str = ".") -> dict[str, Any]:
    """Flatten nested dictionaries into one level with joined keys.

    Lists are left as values. An empty nested dict becomes an empty dict value.

    >>> flatten_dict({"a": {"b": 1, "c": {"d": 2}}, "e": 3})
    {'a.b': 1, 'a.c.d': 2, 'e': 3}
    """
''',
    ),
    (
        "bisect_left",
        '''\
from collections.abc import Sequence


def bisect_left(items: Sequence[int], target: int) -> int:
    """Return the first index at which `target` could be inserted keeping `items` sorted.

    `items` is sorted ascending and may contain duplicates; the index returned is before any
    existing entries equal to `target`. Do not use the bisect module.
    """
''',
    ),
    (
        "top_words",
        '''\
import re
from collections import Counter


def top_words(text: str, k: int = 10, stopwords: frozenset[str] = frozenset()) -> list[tuple[str, int]]:
    """Return the `k` most frequent words in `text` with their counts.

    Words are runs of letters and apostrophes, compared case-insensitively. Words in
    `stopwords` are ignored. Ties are ordered alphabetically.
    """
''',
    ),
)


_CHAT = (
    (
        "trip",
        "User: I'm planning a weekend trip to the mountains.\nAssistant: That sounds lovely! Do you "
        "prefer hiking or relaxing?\nUser: Mostly hiking, but nothing too steep.\nAssistant:",
    ),
    (
        "plant",
        "User: My basil plant keeps wilting.\nAssistant: How often do you water it, and where does it "
        "stand?\nUser: Every day, on a sunny windowsill.\nAssistant:",
    ),
    (
        "bike",
        "User: My bike chain makes a clicking noise.\nAssistant: Does it happen in every gear or only "
        "some?\nUser: Only in the smallest rear gears.\nAssistant:",
    ),
    (
        "gift",
        "User: I need a birthday gift for my sister.\nAssistant: What does she enjoy doing in her free "
        "time?\nUser: She reads a lot and just started painting.\nAssistant:",
    ),
    (
        "sleep",
        "User: I have trouble falling asleep.\nAssistant: What do you usually do in the hour before "
        "bed?\nUser: I answer emails on my phone.\nAssistant:",
    ),
    (
        "bread",
        "User: My homemade bread comes out dense.\nAssistant: Which flour and how long do you let it "
        "rise?\nUser: All-purpose flour, about thirty minutes.\nAssistant:",
    ),
    (
        "interview",
        "User: I have a job interview on Friday.\nAssistant: Congratulations! What is the role?\nUser: "
        "A junior data analyst at a logistics company.\nAssistant:",
    ),
    (
        "budget",
        "User: I want to start saving money each month.\nAssistant: Do you track what you spend "
        "now?\nUser: Not really, I just check my balance sometimes.\nAssistant:",
    ),
    (
        "guitar",
        "User: I started learning guitar last week.\nAssistant: Great! Are you learning from videos or "
        "with a teacher?\nUser: Videos, but my fingertips hurt.\nAssistant:",
    ),
    (
        "move",
        "User: We are moving to a new flat next month.\nAssistant: Exciting! Is it far from where you "
        "live now?\nUser: Across town, and we have a cat.\nAssistant:",
    ),
    (
        "laptop",
        "User: My laptop has become very slow.\nAssistant: How old is it, and does it slow down right "
        "after starting?\nUser: Four years old, and yes, even at startup.\nAssistant:",
    ),
    (
        "run",
        "User: I want to run my first 10 km race.\nAssistant: How far can you run comfortably "
        "today?\nUser: About three kilometres without stopping.\nAssistant:",
    ),
)

_TRANSLATION = (
    ("fr-weather", "Translate into French: The weather will be sunny tomorrow, but it may rain on Sunday."),
    ("de-train", "Translate into German: The next train to the airport leaves in twenty minutes."),
    ("es-library", "Translate into Spanish: The library is closed on public holidays."),
    ("fr-meeting", "Translate into French: Could we move our meeting to Thursday afternoon?"),
    ("de-recipe", "Translate into German: Stir the soup slowly and add salt at the end."),
    ("es-museum", "Translate into Spanish: Children under twelve enter the museum for free."),
    ("fr-package", "Translate into French: Your package was delivered to the neighbour on the left."),
    ("de-doctor", "Translate into German: I would like to make an appointment with the doctor."),
    ("es-hotel", "Translate into Spanish: Breakfast is served from seven until ten in the morning."),
    ("it-station", "Translate into Italian: Excuse me, how do I get to the central station?"),
    ("pt-book", "Translate into Portuguese: I finished the book in two days because it was exciting."),
    ("nl-bike", "Translate into Dutch: We rode our bikes along the river until sunset."),
)

_SUMMARIZATION = (
    (
        "reef",
        "Summarize in one sentence: Coral reefs cover less than one percent of the ocean floor, yet they "
        "shelter about a quarter of all marine species. Rising water temperatures cause corals to expel "
        "the algae that feed them, a process called bleaching. A bleached reef can recover if the water "
        "cools within weeks, but repeated heat waves leave little time for recovery, and many reefs have "
        "lost half their living coral in the past thirty years.\nSummary:",
    ),
    (
        "library",
        "Summarize in one sentence: The town council voted on Tuesday to extend the opening hours of the "
        "public library. From next month the library will open at eight in the morning and close at nine "
        "in the evening on weekdays. The change follows a survey in which most residents said they could "
        "not visit during working hours. The extra hours will be paid for by closing one of the two "
        "mobile library vans.\nSummary:",
    ),
    (
        "bees",
        "Summarize in one sentence: Honeybees communicate the location of flowers through a movement "
        "known as the waggle dance. A forager returning to the hive walks in a figure-eight pattern, and "
        "the angle of the straight run tells the other bees the direction of the food relative to the "
        "sun. The length of the run shows how far away the flowers are. Other bees follow the dancer and "
        "then fly out on their own.\nSummary:",
    ),
    (
        "outage",
        "Summarize in one sentence: On Monday morning the company's payment service was unavailable for "
        "forty minutes. The cause was a configuration change that sent all traffic to a single database "
        "server, which ran out of connections. Engineers rolled back the change and traffic recovered. "
        "The team will now test configuration changes on a small share of traffic before applying them "
        "everywhere.\nSummary:",
    ),
    (
        "tea",
        "Summarize in one sentence: Green and black tea come from the same plant. The difference lies in "
        "processing: leaves for green tea are heated soon after picking, which stops oxidation and keeps "
        "them green, while leaves for black tea are rolled and left to oxidize fully, which darkens them "
        "and changes their flavour. Oolong tea is oxidized only partly and sits between the two.\n"
        "Summary:",
    ),
    (
        "volcano",
        "Summarize in one sentence: The volcano on the island erupted twice last week, sending ash "
        "several kilometres into the air. Flights to the island were cancelled for three days, and "
        "residents of two villages near the crater were moved to a school on the coast. Scientists say "
        "the activity is decreasing, and the villagers are expected to return home by the end of the "
        "month.\nSummary:",
    ),
    (
        "sleep-study",
        "Summarize in one sentence: A study followed two thousand adults for ten years and recorded how "
        "long they slept each night. People who slept between seven and eight hours had the lowest rate "
        "of heart disease. Those who slept less than six hours or more than nine had higher rates, "
        "although the researchers note that illness may cause long sleep rather than the other way "
        "round.\nSummary:",
    ),
    (
        "release",
        "Summarize in one sentence: Version 3.2 of the editor adds a split view, so two files can be "
        "edited side by side. Search is now about twice as fast on large projects, and the settings page "
        "has been reorganized into sections. Support for the oldest supported operating system ends with "
        "this release; users on it should stay on version 3.1.\nSummary:",
    ),
    (
        "glacier",
        "Summarize in one sentence: Measurements taken each summer since 1950 show that the glacier has "
        "retreated by almost two kilometres. Its surface has also dropped by about sixty metres. The "
        "meltwater feeds a river used for drinking water and farming downstream, and local authorities "
        "are planning new reservoirs to store water for dry years when the glacier can no longer supply "
        "it.\nSummary:",
    ),
    (
        "market",
        "Summarize in one sentence: The farmers' market will move from the car park to the main square "
        "starting in April. The new location offers space for twenty more stalls and is closer to the bus "
        "station. The market will still run every Saturday from eight until one, and a new evening market "
        "will be held on the first Friday of each month during the summer.\nSummary:",
    ),
    (
        "octopus",
        "Summarize in one sentence: Octopuses have about five hundred million neurons, most of them in "
        "their arms rather than their central brain. Each arm can taste and touch on its own and react "
        "without waiting for the brain. In experiments octopuses have opened jars, escaped from tanks and "
        "recognized individual keepers, which makes them one of the most studied invertebrates.\n"
        "Summary:",
    ),
    (
        "policy",
        "Summarize in one sentence: Employees may work from home up to three days a week after agreeing "
        "on a schedule with their manager. Teams must hold at least one day each week when everyone is "
        "in the office. Equipment for home offices, such as a monitor and a chair, can be requested "
        "through the internal portal, and travel between home and office is not reimbursed.\nSummary:",
    ),
)

_QA = (
    ("boiling", "Question: Why does water boil at a lower temperature at high altitude?\nAnswer:"),
    ("seasons", "Question: What causes the seasons on Earth?\nAnswer:"),
    ("rust", "Question: Why does iron rust, and how can rusting be prevented?\nAnswer:"),
    ("photosynthesis", "Question: What does a plant need for photosynthesis?\nAnswer:"),
    ("lightning", "Question: Why do we see lightning before we hear thunder?\nAnswer:"),
    ("antibiotics", "Question: Why do antibiotics not work against viruses?\nAnswer:"),
    ("salt", "Question: Why is salt spread on icy roads in winter?\nAnswer:"),
    ("leaves", "Question: Why do leaves change colour in autumn?\nAnswer:"),
    ("bread-rise", "Question: What makes bread dough rise?\nAnswer:"),
    ("compass", "Question: How does a magnetic compass work?\nAnswer:"),
    ("eclipse", "Question: What is the difference between a solar and a lunar eclipse?\nAnswer:"),
    ("password", "Question: Why is a long password safer than a short one?\nAnswer:"),
)

# Each problem is asked as "Solve step by step: PROBLEM\nSolution:".
_MATH_PROBLEMS = (
    ("apples", "A basket holds 24 apples. Tom takes a third of them and Ann takes 5. How many are left?"),
    ("train", "A train travels 180 km in 2 hours and 15 minutes. What is its average speed in km/h?"),
    (
        "discount",
        "A jacket costs 80 euros. It is reduced by 25 percent, then by another 10 percent. Final price?",
    ),
    ("tiles", "A floor is 4.5 m by 3 m. Square tiles have sides of 30 cm. How many tiles cover the floor?"),
    ("ages", "Maria is three times as old as her son. In 12 years she will be twice his age. How old is he?"),
    ("paint", "A litre of paint covers 8 m2. How many litres for two coats on a wall 5 m wide, 2.4 m high?"),
    (
        "savings",
        "Lena saves 15 euros in week one and 5 euros more each week than before. Total after 6 weeks?",
    ),
    ("mix", "How many litres of a 40% juice drink, mixed with 6 litres of water, give a 25% drink?"),
    ("clock", "What is the angle between the hour and minute hands of a clock at 3:30?"),
    ("workers", "Three workers build a wall in 8 hours. How long do four workers take at the same rate?"),
    ("dice", "Two fair dice are rolled. What is the probability that the sum is 8?"),
    ("tank", "A pipe fills a tank in 6 hours; another empties it in 9. With both open, how long to fill it?"),
)
_MATH = tuple((label, f"Solve step by step: {problem}\nSolution:") for label, problem in _MATH_PROBLEMS)

_RAG = (
    (
        "return-policy",
        "Answer from the document only.\nDocument: Items bought in our stores can be returned within 30 "
        "days with the receipt. Electronics must be unopened. Sale items can be exchanged but not "
        "refunded. Online orders can be returned by post free of charge within 14 days.\nQuestion: Can I "
        "get my money back for a sale item?\nAnswer:",
    ),
    (
        "pool",
        "Answer from the document only.\nDocument: The city pool opens at 6:30 on weekdays and at 8:00 on "
        "weekends. Lanes are reserved for swimming clubs on Tuesday and Thursday evenings. Children under "
        "eight must be accompanied by an adult in the water. A ten-visit card costs 40 euros.\nQuestion: "
        "When can I swim on Saturday morning, and what does a ten-visit card cost?\nAnswer:",
    ),
    (
        "api-limits",
        "Answer from the document only.\nDocument: Each API key may send 100 requests per minute. Requests "
        "above the limit receive status 429 and a Retry-After header giving the seconds to wait. Batch "
        "endpoints count as one request per item. Limits can be raised on the Business plan.\nQuestion: "
        "What happens when I send too many requests?\nAnswer:",
    ),
    (
        "vaccination",
        "Answer from the document only.\nDocument: The clinic offers flu vaccinations from October to "
        "December. Appointments are not needed on Monday and Wednesday mornings. People over 65, pregnant "
        "women and health workers are vaccinated free of charge; others pay 15 euros.\nQuestion: Do I need "
        "an appointment, and who is vaccinated for free?\nAnswer:",
    ),
    (
        "warranty",
        "Answer from the document only.\nDocument: The coffee machine has a two-year warranty covering "
        "defects in materials and workmanship. The warranty does not cover damage from limescale, so the "
        "machine must be descaled every month. To make a claim, contact support with the serial number "
        "printed under the water tank.\nQuestion: Where do I find the serial number for a claim?\nAnswer:",
    ),
    (
        "parking",
        "Answer from the document only.\nDocument: Residents may park in zone B with a permit, which costs "
        "60 euros a year. Visitors can park for up to two hours with a ticket from the machines. Parking "
        "is free on Sundays and public holidays. Vehicles blocking driveways are towed.\nQuestion: How long "
        "can a visitor park, and is parking free on Sunday?\nAnswer:",
    ),
    (
        "course",
        "Answer from the document only.\nDocument: The evening course in photography runs for ten weeks, "
        "every Wednesday from 19:00 to 21:00. Participants need their own camera; phones are not enough. "
        "The final session is a trip to the botanical garden. Registration closes on 15 September.\n"
        "Question: What equipment do I need, and when does registration close?\nAnswer:",
    ),
    (
        "backup",
        "Answer from the document only.\nDocument: Backups of the file server run every night at 01:00 "
        "and are kept for 30 days. Monthly backups are kept for a year. To restore a file, open a ticket "
        "with the file path and the date you need. Restores take up to one working day.\nQuestion: How "
        "long are nightly backups kept, and how do I get a file back?\nAnswer:",
    ),
    (
        "recycling",
        "Answer from the document only.\nDocument: Paper and cardboard go in the blue bin, collected every "
        "second Monday. Glass must be taken to the bottle banks near the supermarket. Plastic packaging "
        "goes in the yellow bag, collected on Fridays. Batteries are accepted at the town hall.\nQuestion: "
        "Where do I take empty glass bottles and old batteries?\nAnswer:",
    ),
    (
        "leave",
        "Answer from the document only.\nDocument: Full-time employees receive 25 days of paid leave per "
        "year. Up to five unused days can be carried over to the next year and must be taken by the end "
        "of March. Requests for more than two weeks in a row need approval a month in advance.\n"
        "Question: Can I carry over unused days, and until when?\nAnswer:",
    ),
    (
        "ferry",
        "Answer from the document only.\nDocument: The ferry to the island leaves the harbour at 9:00, "
        "12:00 and 17:00 from May to September, and at 10:00 and 15:00 in the other months. The crossing "
        "takes 50 minutes. Bicycles travel free; cars must be booked a day in advance.\nQuestion: When "
        "does the ferry leave in November, and do I pay for my bicycle?\nAnswer:",
    ),
    (
        "deploy",
        "Answer from the document only.\nDocument: Deployments to production happen on Tuesdays and "
        "Thursdays after 14:00. Every change needs an approved review and a green test run. Database "
        "migrations must be backward compatible for one release. Emergency fixes may be deployed at any "
        "time with the on-call lead's approval.\nQuestion: When can I deploy an urgent fix?\nAnswer:",
    ),
)

_CODE_EDITING = (
    (
        "rename",
        "Rename the variable `lst` to `numbers` in this function and return the whole function.\n\n"
        "def average(lst):\n    if not lst:\n        return 0.0\n    total = 0\n    for x in lst:\n"
        "        total += x\n    return total / len(lst)\n\nAnswer:\n",
    ),
    (
        "type-hints",
        "Add type hints to this function and return the whole function.\n\ndef count_words(text, lower):\n"
        "    counts = {}\n    for word in text.split():\n        key = word.lower() if lower else word\n"
        "        counts[key] = counts.get(key, 0) + 1\n    return counts\n\nAnswer:\n",
    ),
    (
        "comprehension",
        "Rewrite the loop as a list comprehension and return the whole function.\n\ndef squares_of_evens"
        "(values):\n    result = []\n    for v in values:\n        if v % 2 == 0:\n            result.append"
        "(v * v)\n    return result\n\nAnswer:\n",
    ),
    (
        "docstring",
        "Add a docstring to this function and return the whole function.\n\ndef clamp(value, low, high):\n"
        "    if value < low:\n        return low\n    if value > high:\n        return high\n    return "
        "value\n\nAnswer:\n",
    ),
    (
        "f-string",
        "Replace the string formatting with f-strings and return the whole function.\n\ndef describe(name, "
        "age, city):\n    line = '%s is %d years old' % (name, age)\n    return line + ' and lives in "
        "{}.'.format(city)\n\nAnswer:\n",
    ),
    (
        "early-return",
        "Rewrite this function with early returns instead of nested ifs and return the whole function.\n\n"
        "def shipping_cost(weight, express):\n    if weight > 0:\n        if express:\n            return "
        "10 + weight * 2\n        else:\n            return 5 + weight\n    else:\n        raise "
        "ValueError('weight must be positive')\n\nAnswer:\n",
    ),
    (
        "pathlib",
        "Change this function to use pathlib instead of os.path and return the whole function.\n\nimport "
        "os\n\ndef config_path(home, name):\n    folder = os.path.join(home, '.config')\n    if not "
        "os.path.isdir(folder):\n        os.makedirs(folder)\n    return os.path.join(folder, name)\n\n"
        "Answer:\n",
    ),
    (
        "enumerate",
        "Use enumerate instead of range(len(...)) and return the whole function.\n\ndef find_first(items, "
        "target):\n    for i in range(len(items)):\n        if items[i] == target:\n            return i\n"
        "    return -1\n\nAnswer:\n",
    ),
    (
        "dataclass",
        "Turn this class into a dataclass and return the whole class.\n\nclass Point:\n    def __init__"
        "(self, x, y, label):\n        self.x = x\n        self.y = y\n        self.label = label\n\n"
        "    def moved(self, dx, dy):\n        return Point(self.x + dx, self.y + dy, self.label)\n\n"
        "Answer:\n",
    ),
    (
        "with-open",
        "Use a with statement to open the file and return the whole function.\n\ndef read_lines(path):\n"
        "    handle = open(path)\n    lines = [line.rstrip() for line in handle]\n    handle.close()\n"
        "    return lines\n\nAnswer:\n",
    ),
    (
        "exception",
        "Make this function raise KeyError with a clear message when the key is missing, and return the "
        "whole function.\n\ndef lookup(table, key):\n    for k, v in table:\n        if k == key:\n"
        "            return v\n    return None\n\nAnswer:\n",
    ),
    (
        "constant",
        "Move the magic number 0.2 into a module constant named TAX_RATE and return the whole code.\n\n"
        "def gross(net):\n    return round(net * (1 + 0.2), 2)\n\ndef tax(net):\n    return round(net * "
        "0.2, 2)\n\nAnswer:\n",
    ),
)


CATEGORIES: tuple[Category, ...] = (
    Category("chat", "multi-turn conversation: the assistant's next turn", 48, _CHAT),
    Category("translation", "one sentence into French, German, Spanish and others", 40, _TRANSLATION),
    Category("summarization", "a paragraph summarized in one sentence", 48, _SUMMARIZATION),
    Category("qa", "open questions answered briefly", 48, _QA),
    Category("math", "word problems solved step by step", 96, _MATH),
    Category("rag", "a question answered from a given document", 48, _RAG),
    Category("code_completion", "a function's body from its signature and docstring", 200, CODE_COMPLETION),
    Category("code_editing", "a small function rewritten as asked (the answer copies it)", 96, _CODE_EDITING),
)
