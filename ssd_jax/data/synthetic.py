"""Synthetic training prompts shaped like the benchmark tasks, from sources that are not the benchmarks.

A draft learns to predict what the target says, and what the target says depends on what it is asked: ShareGPT's
first turns are mostly chat, while the benchmark prompts are function stubs to complete, grade-school word problems
and short instructions. These builders make prompts of those kinds without touching any benchmark or
held-out set:

- `code_prompts`: public top-level functions of the Python standard library on this machine, cut to their signature
  and docstring, in the same "Complete the following Python function." wrapper the HumanEval loader uses;
- `math_prompts`: word problems from templates written here, with random names, objects and numbers;
- `instruction_prompts`: requests from task templates written here crossed with topic lists written here;
- `question_prompts`: direct questions ("What is ...?", "How do I ...?") over subjects written here;
- `writing_prompts`: letters, posts, stories, speeches and role-play, with places, readers and roles written here.

Everything is seeded and deterministic; the target answers the prompts (`scripts/make_target_corpus.py
--prompts-file`), and those answers, not the prompts, are what the draft trains on.
"""
from __future__ import annotations

import ast
import glob
import os
import random
import sysconfig

from .datasets import CODE_HEADER  # the HumanEval loader's wrapper, so the code prompts read like its stubs
_SKIP_PARTS = ("test", "idlelib", "lib2to3", "site-packages", "turtledemo", "__phello__", "ensurepip")


def stdlib_function_stubs(root: str | None = None) -> list[str]:
  """Signature + docstring stubs of the public, documented top-level functions of the standard library, sorted."""
  root = root or sysconfig.get_paths()["stdlib"]
  stubs = []
  for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
    if any(part in os.path.relpath(path, root) for part in _SKIP_PARTS):
      continue
    try:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
      continue
    for node in tree.body:
      if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or not node.args.args:
        continue
      doc = ast.get_docstring(node)
      if not doc or not 40 <= len(doc) <= 800:
        continue
      node.body, node.decorator_list = [node.body[0]], []
      stubs.append(ast.unparse(node) + "\n")
  return stubs


def code_prompts(n: int, seed: int = 0, root: str | None = None) -> list[str]:
  stubs = stdlib_function_stubs(root)
  random.Random(seed).shuffle(stubs)
  return [CODE_HEADER + s for s in stubs[:n]]


_NAMES = ("Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Liam", "Maya",
          "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wes", "Yuki", "Zane")
_ITEMS = (("apples", 0.5), ("notebooks", 3), ("pencils", 0.25), ("cupcakes", 2), ("stickers", 0.1), ("books", 12),
          ("plants", 6), ("toy cars", 4), ("candles", 5), ("shirts", 15), ("marbles", 0.2), ("tickets", 8))
_MATH = (
    "{a} has {x} {item}. {b} gives {a} {y} more, and then {a} gives away {z}. How many {item} does {a} have now?",
    "{a} buys {x} {item} at ${p} each and pays with a ${bill} bill. How much change does {a} get?",
    "A shop sells {item} in packs of {y}. {a} needs {x} {item}. How many packs must {a} buy?",
    "{a} reads {y} pages a day. The book has {x} pages. After {z} days, how many pages are left to read?",
    "{a} earns ${x} a week and saves {pct}% of it. How much does {a} save in {y} weeks?",
    "A train travels {x} miles in {y} hours. At the same speed, how far does it travel in {z} hours?",
    "{a} is {y} years older than {b}. In {z} years {b} will be {x}. How old is {a} now?",
    "A garden has {x} rows of {y} {item}. {a} sells {z} of them. How many are left?",
    "{a} and {b} share {x} {item} so that {a} gets {y} more than {b}. How many does each get?",
    "A recipe needs {y} eggs for every {z} cakes. How many eggs are needed for {x} cakes?",
    "{a} runs {y} kilometres on weekdays and {z} kilometres on each weekend day. How far does {a} run in {x} weeks?",
    "The price of a jacket is ${x}. It is on sale for {pct}% off. What is the sale price?",
    "{a} fills {y} boxes with {z} {item} each and has {x} {item} left over. How many {item} did {a} start with?",
    "A class of {x} students goes on a trip. Each bus holds {y} students. How many buses are needed, and how many "
    "empty seats are there?",
    "{a} spends a third of ${x} on food and half of what is left on {item}. How much money is left?",
    "A tank holds {x} litres. It leaks {y} litres an hour while a tap adds {z} litres an hour. How long until it "
    "is full if it starts empty?",
)


def math_prompts(n: int, seed: int = 0) -> list[str]:
  rng = random.Random(seed)
  out = []
  for i in range(n):
    a, b = rng.sample(_NAMES, 2)
    item, price = rng.choice(_ITEMS)
    x, y, z = rng.randint(12, 240), rng.randint(2, 12), rng.randint(2, 9)
    bill = next((v for v in (5, 10, 20, 50, 100, 500, 1000) if v > x * price), 1000 * (int(x * price) // 1000 + 1))
    out.append(_MATH[i % len(_MATH)].format(a=a, b=b, item=item, x=x, y=y, z=z, p=f"{price:g}", bill=bill,
                                            pct=rng.choice((10, 15, 20, 25, 30, 40, 50))))
  return out


_TASKS = (
    "Explain {t} to a ten-year-old.", "Write a short story about {t}.", "Give me five tips about {t}.",
    "What are the pros and cons of {t}?", "Write a haiku about {t}.", "Summarize the history of {t} in one paragraph.",
    "Write a persuasive paragraph about why people should care about {t}.",
    "Draft a polite email to my manager asking for a day off to learn about {t}.",
    "Pretend you are a tour guide and describe {t} to visitors.", "What are common misconceptions about {t}?",
    "Create a study plan for learning about {t} in two weeks.", "Write a product description related to {t}.",
    "Compose a tweet announcing a new podcast episode on {t}.", "List three questions an expert in {t} might ask.",
    "Describe {t} in exactly three sentences.", "How would you explain {t} to someone from the year 1800?",
    "Write a limerick about {t}.", "What skills does someone need to work with {t}?",
    "Outline a blog post titled 'Everything you need to know about {t}'.", "Give a step-by-step guide to {t}.",
)
_TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "compound interest", "the Roman Empire", "volcanoes",
    "machine learning", "recycling", "the stock market", "sleep hygiene", "climate change", "the printing press",
    "electric cars", "honeybees", "the Great Wall of China", "public speaking", "time management", "vaccines",
    "the human heart", "jazz music", "chess openings", "renewable energy", "budget travel", "the moon landing",
    "coral reefs", "cloud computing", "meditation", "the French Revolution", "plate tectonics", "baking bread",
    "learning a new language", "the Olympic Games", "cryptography", "urban gardening", "the immune system",
    "ancient Egypt", "social media", "marathon training", "quantum computing", "the Renaissance", "dinosaurs",
    "remote work", "3D printing", "the Amazon rainforest", "personal finance", "Shakespeare", "the internet",
    "first aid", "minimalism", "the solar system", "composting", "electric guitars", "job interviews",
    "the Industrial Revolution", "penguins", "nutrition labels", "hiking safety", "origami", "democracy",
)


def instruction_prompts(n: int, seed: int = 0) -> list[str]:
  pairs = [(t, k) for t in _TASKS for k in _TOPICS]
  random.Random(seed).shuffle(pairs)
  return [task.format(t=topic) for task, topic in pairs[:n]]


# Direct questions, the shape of most general-assistant requests ("What ...?", "How do ...?"), over subjects that
# are not the instruction topics above.
_QUESTIONS = (
    "What is {s}?", "How does {s} work?", "Why is {s} important?", "What are some interesting facts about {s}?",
    "Can you recommend some books or resources to learn about {s}?", "How do I get started with {s}?",
    "What are the main differences between {s} and {s2}?", "What is the history behind {s}?",
    "Who are some well-known people associated with {s}?", "What are the most common mistakes beginners make with {s}?",
    "Is {s} worth it? Why or why not?", "How has {s} changed over the last fifty years?",
    "What should I know before trying {s}?", "Can you explain the basic rules of {s}?",
    "What are the benefits of {s} for a small town?", "How can a student use {s} in everyday life?",
    "What is the best way to explain {s} to a beginner?", "What equipment or tools do I need for {s}?",
    "What are some good questions to ask an expert on {s}?", "How would the world be different without {s}?",
    "I am new to {s}. What terms should I learn first?", "Give me a brief overview of {s} and its future.",
    "My friend says {s} is overrated. How should I respond?", "What are the risks of {s}, and how can they be managed?",
)
_SUBJECTS = (
    "astronomy", "birdwatching", "the metric system", "podcasting", "the Silk Road", "supply chains", "yoga",
    "opera", "rock climbing", "beekeeping", "solar panels", "the Byzantine Empire", "inflation", "vertical farming",
    "wind turbines", "sign language", "graphic design", "the Cold War", "electric bicycles", "sourdough baking",
    "open-source software", "the Nobel Prize", "board games", "volunteering", "deep-sea exploration",
    "hydroelectric dams", "impressionist painting", "the periodic table", "credit scores", "camping", "film noir",
    "the Panama Canal", "desalination", "knitting", "the Mayan civilization", "typography", "carbon taxes",
    "skateboarding", "animal migration", "the Hubble telescope", "ballet", "chemistry sets", "video game design",
    "public libraries", "microfinance", "the Apollo program", "earthquakes", "cybersecurity", "mushroom foraging",
    "classical architecture", "ocean tides", "calligraphy", "container shipping", "the Silk Road's spice trade",
    "weather forecasting", "bonsai trees", "stand-up comedy", "nuclear power", "kite surfing", "the blockchain",
    "wildlife photography", "the Magna Carta", "water purification", "tea ceremonies", "the Northern Lights",
    "self-driving cars", "sculpture", "the Ottoman Empire", "pet care", "bird song", "urban planning",
)
# Writing and role-play tasks with a setting, a reader or a role to fill: letters, posts, stories, speeches.
_WRITING = (
    "Write a travel blog post about a week in {place}, with the sights, the food and one surprise.",
    "Write a short story that begins: \"The {thing} had been in the attic for years.\"",
    "Draft a formal email to {person} asking for feedback on a report about {s}.",
    "Write a persuasive letter to {person} asking them to support a new {thing} program.",
    "Describe a busy morning at a market in {place}, using sights, sounds and smells.",
    "Write a product review of a {product} you have used for a month.",
    "Pretend you are {role}. Describe a typical day at work.",
    "Pretend you are {role} and answer this: what is the hardest part of your job?",
    "Write a two-minute speech for {occasion}.",
    "Write a dialogue between {role} and a curious child about {s}.",
    "Write a poem about {place} at night.", "Write a cover letter for a job as {role}.",
    "Write the opening paragraph of a mystery novel set in {place}.",
    "Write a motivational message for someone starting to learn {s}.",
    "Compose a thank-you note to {person} for their help with {s}.",
    "Write a news article announcing the opening of a new {thing} museum in {place}.",
    "Create a character sketch of {role} who secretly loves {s}.",
    "Write an advertisement for a {product} aimed at students.",
    "Write a short biography of a fictional {role} from {place}.",
    "Write a diary entry of a traveler arriving in {place} for the first time.",
    "Write an invitation for {occasion}.", "Write a friendly text message inviting {person} to try {s}.",
    "Rewrite this sentence to sound more professional: \"hey, the {product} is broken again, fix it pls\".",
    "Write a short fable with a moral, about a {thing} and a river.",
    "Imagine you are {role} being interviewed on the radio. Answer the question: why does {s} matter?",
    "Write a comparison of two {product}s for a buyer's guide, with a recommendation.",
)
_PLACES = (
    "Lisbon", "Kyoto", "a small fishing village", "Marrakesh", "Iceland", "a mountain town in Peru", "Vienna",
    "New Orleans", "the Scottish Highlands", "Hanoi", "a desert oasis", "Cape Town", "Prague", "a floating city",
    "Buenos Aires", "an island in Greece", "Montreal", "a space station", "Istanbul", "a rainforest lodge",
    "Seoul", "a medieval castle", "Nairobi", "the Swiss Alps", "Mexico City", "a lighthouse", "Sydney",
)
_PEOPLE = ("my supervisor", "a neighbour", "the city council", "my teacher", "a new client", "the school principal",
           "an old friend", "the team", "my landlord", "a local newspaper editor")
_ROLES = ("a firefighter", "a marine biologist", "a pastry chef", "a museum guide", "an astronaut", "a detective",
          "a farmer", "a software engineer", "a librarian", "a zookeeper", "a pilot", "a park ranger", "a nurse",
          "a street musician", "a historian", "a personal trainer", "a wedding planner", "a news reporter")
_PRODUCTS = ("smartphone", "coffee maker", "laptop", "pair of running shoes", "electric scooter", "backpack",
             "noise-cancelling headphones", "smart watch", "camping tent", "robot vacuum", "e-reader", "blender")
_THINGS = ("clock", "music box", "map", "letter", "violin", "telescope", "painting", "key", "photograph", "robot")
_OCCASIONS = ("a school graduation", "a company's tenth anniversary", "a friend's wedding", "the opening of a park",
              "a retirement party", "a charity fundraiser", "the first day of a new team", "a science fair")


def question_prompts(n: int, seed: int = 0) -> list[str]:
  """Direct questions from `_QUESTIONS` x `_SUBJECTS` (a second subject where a template compares two)."""
  rng = random.Random(seed)
  pairs = [(q, s) for q in _QUESTIONS for s in _SUBJECTS]
  rng.shuffle(pairs)
  return [q.format(s=s, s2=rng.choice([x for x in _SUBJECTS if x != s])) for q, s in pairs[:n]]


def writing_prompts(n: int, seed: int = 0) -> list[str]:
  """Writing and role-play tasks from `_WRITING`, each slot filled at random (distinct prompts)."""
  rng = random.Random(seed)
  out, seen = [], set()
  for i in range(50 * n):  # the templates in turn; one whose fills are used up is passed over
    if len(out) == n:
      break
    fill = dict(place=rng.choice(_PLACES), person=rng.choice(_PEOPLE), role=rng.choice(_ROLES),
                product=rng.choice(_PRODUCTS), thing=rng.choice(_THINGS), occasion=rng.choice(_OCCASIONS),
                s=rng.choice(_SUBJECTS + _TOPICS))
    p = _WRITING[i % len(_WRITING)].format(**fill)
    if p not in seen:
      seen.add(p)
      out.append(p)
  return out


def synthetic_prompts(n_code: int, n_math: int, n_instruct: int, seed: int = 0, n_question: int = 0,
                      n_writing: int = 0) -> list[dict]:
  """{"prompt", "kind"} records, the kinds interleaved (so any prefix of the list holds all of them)."""
  kinds = [("code", code_prompts(n_code, seed)), ("math", math_prompts(n_math, seed)),
           ("instruction", instruction_prompts(n_instruct, seed)), ("question", question_prompts(n_question, seed)),
           ("writing", writing_prompts(n_writing, seed))]
  out, i = [], 0
  while any(i < len(p) for _, p in kinds):
    out += [{"prompt": p[i], "kind": k} for k, p in kinds if i < len(p)]
    i += 1
  return out
