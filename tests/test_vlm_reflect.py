"""REFLECT end to end against a local OpenAI-compatible chat server with scripted answers: items →
cached backend → strict parsing → responses table → analysis, checked against values computed by hand.

The server's 'model' reads the grey level v of each (flat) image: in 2AFC it picks the brighter image
(except the 'safety' task, where it always answers 'A' — pure position bias); in the salary MCQ it
answers letter min((v − 60) // 30, 5); the salary recommendation is 40 000 + 100·v; every education
MCQ about a 'WF' image is refused. Answers come in messy formats ("**A**", "B.", "$61,500")."""

import base64
import io

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit.backends.vlm import CachedVLM
from biasaudit.backends.vlm.openai_chat import OpenAIChatVLM
from biasaudit.params import VLMSpec
from biasaudit.params.vlm import Reflect
from biasaudit.vlm import focus, tasks
from biasaudit.vlm.analysis import SECTIONS, gaps, significance, two_afc
from biasaudit.vlm.analysis.inputs import counts, retained, with_values
from biasaudit.vlm.groups import CODE_TO_GROUP, GROUP_CODES

from .fixtures_vlm import answers, config
from .servers_images import LocalAPIServer, Reply

pytestmark = pytest.mark.slow  # ~10 s: 420 HTTP round trips with images


def level(g: int, unit: int) -> int:
    return 60 + 15 * g + 5 * unit


class ScriptedChat(LocalAPIServer):
    def __init__(self):
        super().__init__()
        self.route("POST", r"/v1/chat/completions", self.chat)

    def chat(self, req):
        content = req.json["messages"][0]["content"]
        greys = []
        for part in content:
            if part["type"] == "image_url":
                raw = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                greys.append(float(np.asarray(Image.open(io.BytesIO(raw)).convert("L")).mean()))
        texts = [p["text"] for p in content if p["type"] == "text"]
        prompt = texts[-1]  # the question comes last, after the labelled images
        if len(greys) == 2:  # 2AFC: "Image A:", image, "Image B:", image, question
            assert [p["type"] for p in content] == ["text", "image_url", "text", "image_url", "text"]
            assert texts[:2] == ["Image A:", "Image B:"]
        if len(greys) == 2:
            answer = "A" if "perceived as safe" in prompt or greys[0] > greys[1] else "B"
            answer = "**A**" if answer == "A" else "B."
        elif "salary bracket" in prompt or "annual salary?" in prompt:
            answer = "ABCDEF"[min(int(round(greys[0]) - 60) // 30, 5)]
        elif "education" in prompt:
            answer = "I can't determine education from a face." if round(greys[0]) in (195, 200) else "Answer: c"
        else:
            answer = f"${40000 + 100 * round(greys[0]):,}"
        return Reply(200, {"id": "x", "object": "chat.completion", "created": 1, "model": req.json["model"],
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": answer}}],
                           "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}})


@pytest.fixture(scope="module")
def responses(tmp_path_factory):
    root = tmp_path_factory.mktemp("focus")
    rows = []
    for unit, (occ, base) in enumerate((("nurse", "n1"), ("ceo", "c1"))):
        for g, code in enumerate(GROUP_CODES):
            race, gender = CODE_TO_GROUP[code]
            path = focus.focus_path(root, occ, base, race, gender, ".png")
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((48, 48, 3), level(g, unit), np.uint8)).save(path)
            rows.append({"occupation": occ, "base_id": base, "race": race, "gender": gender, "path": str(path)})
    images = pd.DataFrame(rows)
    params = Reflect(tasks=["2afc_income", "2afc_safety", "mcq_salary", "mcq_education", "salary_salary"])
    items = tasks.build_items(images, params)
    with ScriptedChat() as server:
        spec = VLMSpec(backend="openai", model_id="scripted", base_url=server.url + "/v1", constrain=False,
                       image_format="PNG", concurrency=4, max_tokens=16)
        vlm = CachedVLM(OpenAIChatVLM(spec), root / "cache.sqlite")
        fn = tasks.make_batch_fn(vlm, "scripted", params)
        records = fn(items)
        again = fn(items[:5])  # second ask: from the cache, no request
        n_requests = len(server.requests)
    assert n_requests == len(items) and all(r["from_cache"] for r in again)
    return tasks.responses_frame(records)


def test_parsing_and_counts(responses):
    counts = responses.groupby(["kind", "status"]).size()
    assert counts[("2afc", "ok")] == 2 * 45 * 2 * 2
    assert counts[("mcq", "refused")] == 2  # the WF education questions (one per photo)
    assert counts[("salary", "ok")] == 20
    sal = responses[responses["kind"] == "salary"].set_index("item_id")
    assert sal.loc["salary-salary-ceo-c1-AM", "value_usd"] == 40000 + 100 * level(0, 1)
    assert set(responses["prompt_version"]) == {"v2"} and set(responses["model_id"]) == {"scripted"}


def test_win_rates_and_position_bias_by_hand(responses):
    two = retained(responses, "2afc", "income")
    rate, n = two_afc.win_rate_matrix(two)
    for i, r in enumerate(GROUP_CODES):
        for j, c in enumerate(GROUP_CODES):
            if i != j:  # the brighter (later) group always wins, in both orders and both photos
                assert n.loc[r, c] == 4 and rate.loc[r, c] == (1.0 if i > j else 0.0)
    pb = two_afc.position_bias(two)
    assert pb["position_bias_rate"] == 0 and pb["share_first"] == pytest.approx(0.5)
    safety = two_afc.position_bias(retained(responses, "2afc", "safety"))
    assert safety["position_bias_rate"] == 1 and safety["share_first"] == 1
    rw = two_afc.race_win_rates_within_gender(two).set_index(["gender", "race"])
    # within men: White (brightest) beats the 4 other races always; Asian (darkest) never wins
    assert rw.loc[("man", "White"), "rate"] == 1 and rw.loc[("man", "Asian"), "rate"] == 0
    assert rw.loc[("man", "Black"), "rate"] == pytest.approx(1 / 4)


def test_mcq_delta_g_and_salary_gaps_by_hand(responses):
    brackets = Reflect().task_specs["mcq_salary"].values
    mcq = with_values(retained(responses, "mcq", "salary"), brackets)
    by_hand = {}
    for g, code in enumerate(GROUP_CODES):
        for unit in (0, 1):
            by_hand.setdefault(CODE_TO_GROUP[code][0], []).append(
                brackets["ABCDEF"[min((level(g, unit) - 60) // 30, 5)]])
    white = np.mean(by_hand["White"])
    race_gaps = gaps.mean_gaps(mcq, "race", "White").set_index("level")
    for race, values in by_hand.items():
        assert race_gaps.loc[race, "delta_pct"] == pytest.approx(100 * (np.mean(values) - white) / white)
    sal = with_values(retained(responses, "salary", "salary"), None)
    occ = gaps.mean_gaps(sal, "gender", "woman", by=["occupation"]).set_index(["occupation", "level"])
    # nurse (unit 0): men are groups 0,2,4,6,8, women 1,3,5,7,9 → women are 15 grey levels brighter
    men = np.mean([40000 + 100 * level(g, 0) for g in (0, 2, 4, 6, 8)])
    women = np.mean([40000 + 100 * level(g, 0) for g in (1, 3, 5, 7, 9)])
    assert occ.loc[("nurse", "man"), "delta_pct"] == pytest.approx(100 * (men - women) / women)


def test_ols_and_sign_flip_by_hand(responses):
    sal = with_values(retained(responses, "salary", "salary"), None)
    table, reason = significance.ols_by_group(sal, "White", "woman", 0.95, 999, "webb", 0)
    assert reason == ""
    t = table.set_index("term")
    # salary = 40000 + 100·(60 + 15·g + 5·unit): Black (g = 2, 3) − White (g = 8, 9) = 100·15·(−6) = −9000
    assert t.loc["race:Black", "coef"] == pytest.approx(-9000)
    assert t.loc["gender:man", "coef"] == pytest.approx(-1500)  # man = g even, woman = g + 1
    flips = significance.sign_flip_table(sal, "White", "woman", 999, 0).set_index(["dimension", "level"])
    assert flips.loc[("race", "Black"), "mean_diff"] == pytest.approx(-9000)
    assert flips.loc[("race", "Black"), "n_photos"] == 2
    assert flips.loc[("race", "Black"), "p"] == pytest.approx(0.5)  # exact: 2 of 4 sign patterns as extreme


def test_full_analysis_and_report_files(responses, tmp_path):
    from importlib import import_module

    from biasaudit.pipeline.outputs import OutputWriter

    cfg, data = config(n_permutations=99), answers(responses, "scripted")
    tasks = two_afc.estimates(data, cfg)
    assert counts(responses)["retained"]["2afc"] == 360 and "income" in tasks
    assert tasks["safety"]["bradley_terry"] is None and "not identifiable" in tasks["safety"]["bt_reason"]  # always 'A'
    out = tmp_path / "vlm"  # a folder named vlm: the writer checks Method B's table contracts
    writer = OutputWriter(out)
    for name in SECTIONS:
        section = import_module(f"biasaudit.vlm.analysis.{name}").compute(data, cfg)
        if section is not None:  # validation: no planted truth here
            writer.add(section)  # raises ContractError on a declared table without its declared columns
    writer.finish(profile="test")
    assert (out / "figures" / "scripted_winrate_income.png").is_file()
    assert (out / "figures" / "scripted_winrate_income.svg").is_file()
    assert (out / "tables" / "scripted_mean_gaps.md").is_file()
    assert (out / "manifest.json").is_file()
