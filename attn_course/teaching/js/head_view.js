// The head view: every attention head of a model, and the lines of one head, in the browser.
//
// Rendered by anywidget (JupyterLab 4, Notebook 7, VS Code, Colab) from the state of a
// `attn_course.head_view.HeadView`, or, where no widget manager runs (a static website, an
// exported notebook), by the same `render` over `staticModel(state)`: the state travels inside
// the page, so nothing is ever fetched. No imports, no network, no libraries.
//
// State (the Python traits of HeadView):
//   tokens      [N_q] strings, the queries (left column)
//   key_tokens  [N_k] strings, the keys (right column); N_k = N_q for self-attention
//   weights     [L][H][N_q][N_k] attention weights, each row sums to 1 (or 0: fully masked)
//   layer, head the head drawn large (synced both ways: the selectors, the thumbnails, Python)
//   token       the query whose row is pinned by a click, or -1
//   title       a line above the view
//
// The page: a layer and a head selector; the head as two columns of tokens, joined by a line
// from each query to each key, thicker and darker with the weight; hovering (or focusing, or
// clicking to pin) a query shows only its row, with every weight written next to its key, and
// hovering a key shows its column the same way; below, one thumbnail per head (a small
// multiple: the head's N_q x N_k map, darker = more weight); a click on one selects it.

const SVG = "http://www.w3.org/2000/svg";
const ROW_HEIGHT = 22; // px between two tokens of a column
const LINE_WIDTH = 5; // px: the stroke of a weight of 1
const THUMB_CELL = 4; // px per cell of a thumbnail's map (minimum; small maps are drawn larger)

function element(tag, attributes = {}, text = null) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== null) node.textContent = text;
  return node;
}

function svgElement(tag, attributes = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  return node;
}

// A stand-in for anywidget's model, for pages without a widget manager: the same get/set/on,
// over a plain object.
function staticModel(state) {
  const values = { ...state };
  const listeners = {};
  return {
    get: (name) => values[name],
    set(name, value) {
      values[name] = value;
      for (const callback of listeners[`change:${name}`] || []) callback();
    },
    save_changes() {},
    on(event, callback) {
      (listeners[event] = listeners[event] || []).push(callback);
    },
    off() {},
  };
}

function render({ model, el }) {
  const tokens = model.get("tokens");
  const keyTokens = model.get("key_tokens");
  const weights = model.get("weights"); // [L][H][N_q][N_k]
  const layers = weights.length;
  const heads = weights[0].length;
  // What the mouse points at now ({side, index}), which wins over the pinned query.
  let pointed = null;

  const root = element("div", { class: "attn-head-view" });
  el.replaceChildren(root);
  const title = model.get("title");
  if (title) root.append(element("div", { class: "hv-title" }, title));

  // --- the selectors ---------------------------------------------------------------------------
  const controls = element("div", { class: "hv-controls" });
  const selector = (label, count, name) => {
    const wrapper = element("label", {}, `${label} `);
    const select = element("select", { "data-control": name, "aria-label": label });
    for (let index = 0; index < count; index++) select.append(element("option", { value: index }, String(index)));
    select.addEventListener("change", () => {
      model.set(name, Number(select.value));
      model.save_changes();
    });
    wrapper.append(select);
    controls.append(wrapper);
    return select;
  };
  const layerSelect = selector("Layer", layers, "layer");
  const headSelect = selector("Head", heads, "head");
  const readout = element("span", { class: "hv-readout", "aria-live": "polite" });
  controls.append(readout);
  root.append(controls);

  // --- one head, large: two columns of tokens and the lines between them ----------------------
  const main = element("div", { class: "hv-main" });
  const queryColumn = element("div", { class: "hv-column hv-queries" });
  const keyColumn = element("div", { class: "hv-column hv-keys" });
  const rows = Math.max(tokens.length, keyTokens.length);
  const svg = svgElement("svg", { class: "hv-lines", width: 160, height: rows * ROW_HEIGHT });
  main.append(queryColumn, svg, keyColumn);
  root.append(main);

  const tokenCell = (text, side, index) => {
    const cell = element("div", { class: "hv-token", tabindex: 0, "data-side": side, "data-index": index });
    const label = element("span", { class: "hv-label" }, text);
    const number = element("span", { class: "hv-weight" });
    if (side === "query") cell.append(number, label);
    else cell.append(label, number);
    const point = () => {
      pointed = { side, index };
      draw();
    };
    const leave = () => {
      pointed = null;
      draw();
    };
    cell.addEventListener("mouseenter", point);
    cell.addEventListener("focus", point);
    cell.addEventListener("mouseleave", leave);
    cell.addEventListener("blur", leave);
    if (side === "query") {
      // A click pins this query's row (another click on it unpins it).
      cell.addEventListener("click", () => {
        model.set("token", model.get("token") === index ? -1 : index);
        model.save_changes();
      });
    }
    return cell;
  };
  const queryCells = tokens.map((text, index) => tokenCell(text, "query", index));
  const keyCells = keyTokens.map((text, index) => tokenCell(text, "key", index));
  queryColumn.append(...queryCells);
  keyColumn.append(...keyCells);

  // --- every head, small: the overview ------------------------------------------------------
  const overview = element("div", { class: "hv-overview" });
  overview.append(element("div", { class: "hv-corner" }, "layer \\ head"));
  for (let head = 0; head < heads; head++) overview.append(element("div", { class: "hv-axis" }, String(head)));
  const scale = Math.max(THUMB_CELL, Math.ceil(40 / Math.max(tokens.length, keyTokens.length)));
  const thumbnails = [];
  for (let layer = 0; layer < layers; layer++) {
    overview.append(element("div", { class: "hv-axis" }, String(layer)));
    for (let head = 0; head < heads; head++) {
      const canvas = element("canvas", {
        class: "hv-thumb",
        width: keyTokens.length * scale,
        height: tokens.length * scale,
        "data-layer": layer,
        "data-head": head,
        title: `layer ${layer}, head ${head}`,
      });
      canvas.addEventListener("click", () => {
        model.set("layer", layer);
        model.set("head", head);
        model.save_changes();
      });
      thumbnails.push(canvas);
      overview.append(canvas);
    }
  }
  overview.style.gridTemplateColumns = `auto repeat(${heads}, max-content)`;
  root.append(element("div", { class: "hv-caption" }, "All heads (rows: layers, columns: heads); click one to draw it above."));
  root.append(overview);

  function drawThumbnails(query) {
    for (const canvas of thumbnails) {
      const map = weights[Number(canvas.dataset.layer)][Number(canvas.dataset.head)];
      const context = canvas.getContext("2d");
      context.fillStyle = "#ffffff";
      context.fillRect(0, 0, canvas.width, canvas.height);
      map.forEach((row, i) => {
        row.forEach((weight, j) => {
          // Darker = more weight; the pointed query's row stands out in orange.
          const alpha = Math.min(1, Math.max(0, weight));
          context.fillStyle = i === query ? `rgba(230, 120, 20, ${alpha})` : `rgba(31, 119, 180, ${alpha})`;
          context.fillRect(j * scale, i * scale, scale, scale);
        });
      });
      const selected = Number(canvas.dataset.layer) === model.get("layer") && Number(canvas.dataset.head) === model.get("head");
      canvas.classList.toggle("hv-selected", selected);
    }
  }

  function draw() {
    const layer = model.get("layer");
    const head = model.get("head");
    const map = weights[layer][head]; // [N_q][N_k]
    layerSelect.value = String(layer);
    headSelect.value = String(head);
    const pinned = model.get("token");
    const active = pointed || (pinned >= 0 ? { side: "query", index: pinned } : null);

    // Lines: all of them, faint, or only the active row (query) or column (key).
    svg.replaceChildren();
    const width = Number(svg.getAttribute("width"));
    map.forEach((row, i) => {
      row.forEach((weight, j) => {
        const shown = !active || (active.side === "query" ? active.index === i : active.index === j);
        if (!shown || weight <= 0) return;
        svg.append(svgElement("line", {
          x1: 2, y1: (i + 0.5) * ROW_HEIGHT, x2: width - 2, y2: (j + 0.5) * ROW_HEIGHT,
          "stroke-width": Math.max(0.5, LINE_WIDTH * weight),
          "stroke-opacity": active ? Math.min(1, 0.15 + weight) : Math.min(1, 0.6 * weight),
          class: "hv-line",
        }));
      });
    });

    // Numbers next to the tokens at the other end of the active row or column.
    queryCells.forEach((cell, i) => {
      cell.classList.toggle("hv-active", !!active && active.side === "query" && active.index === i);
      cell.classList.toggle("hv-pinned", pinned === i);
      const number = cell.querySelector(".hv-weight");
      number.textContent = active && active.side === "key" ? map[i][active.index].toFixed(3) : "";
    });
    keyCells.forEach((cell, j) => {
      cell.classList.toggle("hv-active", !!active && active.side === "key" && active.index === j);
      const number = cell.querySelector(".hv-weight");
      number.textContent = active && active.side === "query" ? map[active.index][j].toFixed(3) : "";
    });
    if (!active) readout.textContent = "point at a token to see its weights; click a query to pin it";
    else if (active.side === "query") readout.textContent = `"${tokens[active.index]}" (query ${active.index}) reads from the keys on the right`;
    else readout.textContent = `how much each query on the left reads from "${keyTokens[active.index]}" (key ${active.index})`;
    drawThumbnails(active && active.side === "query" ? active.index : -1);
  }

  for (const name of ["layer", "head", "token"]) model.on(`change:${name}`, draw);
  draw();
}

export default { render };
