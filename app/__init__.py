"""Tandem's application core: what a pane is, without any widget.

No Qt here: plain asyncio plus callbacks. Under qasync the asyncio loop is
the Qt GUI loop, so every callback below runs on the GUI thread.

Modules
-------
app.settings      Settings (defaults in code, one JSON file in the config
                  folder; $TANDEM_CONFIG_DIR overrides the folder).
                  Settings.load(path=None) never raises for a bad file: it
                  returns defaults where values are invalid, keeps the file
                  aside as settings.json.bad and sets `load_warning`.
                  settings.save(path=None); settings.engine_kwargs().
                  Fields: model, device, dtype, threads (None = engine
                  policy), kv_cache_mb, default_params (SamplingParams),
                  default_system_prompt, theme, ui_state (free-form dict the
                  window may use for geometry etc.).
app.errors        AppError and its subclasses; each message can be shown to
                  the user as it is.
app.events        The events Workspace.subscribe callbacks receive.
app.files         write_text_atomically (a user's file: regular files only,
                  never half written, 0600; UnsafeOutputError otherwise) and
                  make_private_file (Tandem's own files, tightened to 0600).
app.secrets       default_secrets(): API keys in the OS keyring where one is
                  usable, else a 0600 file in the config folder; never in the
                  chat store.

app.workspace     What the window shows, without widgets:
  .workspace        Workspace (Pane, Turn, ModelSlot re-exported from the
                    modules below).
  .pane             Pane: one column, its conversation and backend.
  .conversation     Message, ReplyStats, Conversation (see its docstring for
                    how the kept token ids are grown and cut).
  .model_slots      ModelSlot (one model: state, progress, error, engine) and
                    ModelSlots: each model's engine loaded and closed off
                    the GUI thread, with progress.
  .replies          Turn, and the replies streaming into panes: one engine
                    batch per model, one request per remote pane.
  .context_policy   What a prompt holds when the conversation outgrows the
                    context ("stop" or "drop_oldest").
  .compare          word_diff(a, b) -> (segments of a, segments of b).

app.models        The models a user can pick:
  .registry         ModelRegistry: the default model plus added folders and
                    imported GGUF files (models.json); ModelError subclasses.
  .memory_estimate  What a model will take (weights + KV pool) and whether it
                    fits beside the models already loaded.

app.store         The chats on disk:
  .chat_store       ChatStore: conversations, messages and the pane layout in
                    SQLite (the queries; re-exports the names below).
  .connection       Where the file is; opening it (WAL, checks, migration; a
                    damaged file is kept aside and a new store started).
  .schema           SCHEMA_VERSION and the current tables.
  .migrations       One function per schema version step, applied in order.
  .records          PaneLayout, ConversationSummary, HeaderRecord,
                    MessageRecord and the encodings of their values.
  .errors           StoreError and subclasses (disk full, read-only, locked,
                    corrupt, newer).
  .writer           StoreWriter: every write on one background thread, from
                    snapshots taken on the caller's thread.
  .recorder         ChatRecorder: keeps the store in step with a Workspace
                    (messages, replies when they end, checkpoints of a
                    streaming reply every ~2 s, the layout).
  .session          ChatSession: open the store (crash detection), restore
                    the panes, record, and mark a clean exit on close.
  .export           Markdown / JSON export, JSON import, side-by-side comparison.
  .cli              `tandem chats list|export|import` (no Qt, no torch).

app.remote        Other servers and serving ours:
  .openai_client    OpenAIClient for an OpenAI-compatible server (RemoteError
                    and subclasses).
  .remote_pane      RemoteBackend (a pane's server: base_url, model, api_key
                    kept out of repr) and RemoteReply (one streaming reply).
  .local_server     LocalServer: serve the loaded engines over the OpenAI API.

Workspace API (additions to the agreed contract are marked +)
-------------------------------------------------------------
    Workspace(settings=None, *, engine=None, resolve_model=None, model_options=None)
        # engine: an already loaded Engine for settings.model;
        # resolve_model(model_id) -> what Engine(model=...) takes;
        # + model_options(model_id) -> that model's own Engine arguments
        #   (the registry's "Quantize at load" choice: {"quantize": "int4"})
    Each local pane runs conversation.model_id; panes on one model share one
    engine, in a ModelSlot: slot_model_ids() (every model loading, ready or
    failed), model_slot(id) -> ModelSlot | None (.state, .progress, .error,
    .engine, .options). load_model(id) /
    unload_model(id), engine_for(id), model_state(id), pane_model_state(pane),
    loaded_models(), model_busy(id), model_in_use(id); set_model(pane, id),
    set_context_policy(pane, "stop" | "drop_oldest"), open_conversation(conv).
    engine / engine_state / load_progress / load_error describe the default
    (settings.model) model.
    panes: list[Pane]; pane(id) -> Pane (+); index_of(id) (+)
    add_pane(after=None), close_pane(id) (LastPaneError for the only pane),
    move_pane(id, new_index), fork_pane(id, message_index), clear_pane(id) (+),
    set_params(id, SamplingParams), set_system_prompt(id, text), set_title(id, text) (+)
    await set_remote(id, base_url, model, api_key=None) -> RemoteBackend (+)
        # checks GET /v1/models; raises the RemoteError, pane unchanged
    set_local(id) (+)
    await send(text, targets=None) -> Turn     # returns once queued (+ Turn)
    await regenerate(id) -> Turn               # also answers a last user message without a reply
    await edit_and_resend(id, message_index, text) -> Turn
    stop(id=None)
    await wait_idle() (+)                      # until no reply streams
    Turn (+): pane_ids, request_ids, done, await wait(), stop()
    engine_state: "unloaded" | "loading" | "ready" | "error" | "closed"
        (+ "unloaded" before load_engine, "closed" after shutdown)
    load_progress, load_error
    await load_engine(settings=None) -> bool (+ bool: ready; failures are
        reported as state "error", not raised)
    stats() -> engine.EngineStats | None
    await shutdown(); closed (True once shutdown began)
    subscribe(callback) -> unsubscribe

    Pane: id, title, conversation, busy (property), remote (RemoteBackend | None),
        backend ("local" | "remote"; remote panes stream over HTTP with the
        same events, keep no token ids, and need no loaded engine)
    Conversation: system_prompt, params, model_id, messages, kept_ids,
        context_used, context_limit (0 until a model is loaded),
        streaming / streaming_index (+), fork(i), truncate(n) (+)
    Message: role, text, token_ids, state, stats, error
    events.PaneAdded gains `index` (+: its position in panes).

Errors (app.errors): EngineNotReadyError, PaneBusyError (.pane_ids, .titles),
UnknownPaneError, LastPaneError, EmptyMessageError, NoTargetError,
MessageIndexError, NothingToRegenerateError, ContextFullError. Engine errors
(engine.errors.PromptError and subclasses) pass through unwrapped.
"""
