/* Search ranking for this site (conf.py: html_search_scorer; Sphinx puts it in language_data.js).
 *
 * Sphinx ranks by where a word occurs; a glossary entry or the ledger (which names every claim)
 * then outranks the page about the topic. Two adjustments, and nothing else:
 *  - a page whose file name or title contains the whole query is that topic's page: it comes
 *    first ("reshard_after_forward" -> plot_reshard_after_forward, "out of memory" -> the page
 *    titled "... runs out of memory");
 *  - the ledger, the API reference and the index pages stay in the results, below the pages.
 */
(function () {
  // The API reference by more than its best object match (Sphinx 9 scores an object named like
  // the query up to about 180: "guide.hangs" for "hang" measured 171), so it stays below every
  // page that mentions the term (5) and its topic page (150 and up).
  const DOWN = { "pages/ledger": 30, "api": 300, "genindex": 30, "py-modindex": 30 };
  // Above an exact glossary or index entry (Sphinx scores those 100).
  const TOPIC_BOOST = 150;

  function query() {
    const params = new URLSearchParams(window.location.search);
    return (params.get("q") || "").toLowerCase().replace(/\s+/g, " ").trim();
  }

  function score(result) {
    const [docname, title, , , base] = result;
    const q = query();
    let s = base - (DOWN[docname] || 0);
    if (q) {
      const file = docname.split("/").pop().toLowerCase();
      const pageTitle = String(title || "").split(" > ")[0].toLowerCase();
      if (file.includes(q.replace(/ /g, "_")) || pageTitle.includes(q)) s += TOPIC_BOOST;
    }
    return s;
  }

  if (typeof Scorer === "undefined") {
    // language_data.js ran first: define Sphinx's defaults (searchtools.js keeps an existing one).
    window.Scorer = {
      objNameMatch: 11, objPartialMatch: 6, objPrio: { 0: 15, 1: 5, 2: -5 }, objPrioDefault: 0,
      title: 15, partialTitle: 7, term: 5, partialTerm: 2,
    };
  }
  Scorer.score = score;
})();
