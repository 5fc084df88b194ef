"""The web page in a real headless browser: Debian's chromium, driven by selenium with the
system's chromedriver (nothing downloaded). It types a sentence, clicks Translate, and
checks that the translation and its cross-attention heatmap appear, then asks for an
n-best list with scores."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.integration.serve_process import ServeProcess, train_checkpoint

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def server(demo_data_dir, tmp_path_factory):
    checkpoint = train_checkpoint(demo_data_dir, tmp_path_factory.mktemp("serve-browser-run"))
    process = ServeProcess(checkpoint)
    yield process
    assert process.stop() == 0, process.output()


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_window_size(1200, 900)
    yield driver
    driver.quit()


def test_type_click_see_the_translation_and_its_heatmap(server, browser, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    sentence = "I bought twenty-one books."
    want = httpx.post(
        f"{server.url}/v1/translate", json={"texts": [sentence], "return_attention": True}
    ).json()["results"][0]
    wait = WebDriverWait(browser, 60)

    browser.get(server.url + "/")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))  # models listed
    browser.find_element(By.ID, "source").send_keys(sentence)
    browser.find_element(By.ID, "translate").click()
    best = wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".result li.best")))
    browser.save_screenshot(str(tmp_path / "page.png"))  # for a person looking into a failure

    assert best.text.strip() == want["translations"][0]["text"].strip()
    assert browser.find_element(By.CSS_SELECTOR, ".result .source").text == sentence
    table = browser.find_element(By.CSS_SELECTOR, ".result table.heatmap")
    attention = want["attention"]
    columns = table.find_elements(By.CSS_SELECTOR, "thead th[scope=col]")
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert [c.get_attribute("textContent") for c in columns] == attention["source"]
    assert [r.find_element(By.TAG_NAME, "th").get_attribute("textContent") for r in rows] == (
        attention["target"]
    )
    cells = table.find_elements(By.CSS_SELECTOR, "tbody td")
    assert len(cells) == len(attention["source"]) * len(attention["target"])
    shaded = [c.value_of_css_property("background-color") for c in cells]
    assert len(set(shaded)) > 1  # the weights show as different shades
    status = browser.find_element(By.ID, "status").text
    assert status.startswith("Translated by en-de"), status

    # n-best with scores, on request: three translations, best first, each with its score
    nbest = httpx.post(
        f"{server.url}/v1/translate", json={"texts": [sentence], "nbest": 3, "return_scores": True}
    ).json()["results"][0]["translations"]
    field = browser.find_element(By.ID, "nbest")
    field.clear()
    field.send_keys("3")
    browser.find_element(By.ID, "scores").click()
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".result li.translation")) == 3)
    items = browser.find_elements(By.CSS_SELECTOR, ".result li.translation")
    assert "best" in items[0].get_attribute("class").split()
    for item, want_one in zip(items, nbest):
        shown = item.find_element(By.CSS_SELECTOR, ".score").text
        text = item.get_attribute("textContent")
        assert text[: len(text) - len(shown)].strip() == want_one["text"].strip()
        assert abs(float(shown) - want_one["score"]) <= 0.0005 + 1e-9  # shown with 3 decimals


def test_the_api_docs_page_renders_every_route_from_this_server_only(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    api = httpx.get(f"{server.url}/openapi.json").json()
    browser.get(server.url + "/docs")
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#schemas h3"))
    assert browser.find_element(By.ID, "status").text == ""
    shown = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#routes h3 code")]
    assert sorted(set(shown)) == sorted(api["paths"])
    schemas = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#schemas h3")]
    assert schemas == list(api["components"]["schemas"])
    assert "texts" in browser.find_element(By.ID, "schemas").text  # fields with their types
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert loaded and all(url.startswith(server.url + "/") for url in loaded), loaded
