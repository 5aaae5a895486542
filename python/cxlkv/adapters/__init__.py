"""Engine adapters: each module is loaded by its engine's own mechanism and imports that engine,
so importing `cxlkv.adapters` alone imports none of them.

- `cxlkv.adapters.llama_cpp`: `CxlkvLlamaCache`, a llama-cpp-python `BaseLlamaCache`
  (`llm.set_cache(CxlkvLlamaCache.for_llama(llm, "shm:kv"))`).
- `cxlkv.adapters.lmcache`: `CxlkvStorageBackend`, an LMCache `StoragePluginInterface`
  (`storage_plugins` / `storage_plugin.<name>.module_path` / `class_name` in LMCache's config).
- `cxlkv.adapters.sglang`: `CxlkvHiCacheStorage`, an SGLang `HiCacheStorage`
  (`--hicache-storage-backend dynamic` with `module_path` / `class_name`).
- `cxlkv.adapters.vllm`: `CxlkvConnector`, a vLLM `KVConnectorBase_V1` (`--kv-transfer-config`
  with `kv_connector_module_path` "cxlkv.adapters.vllm").

docs/ADAPTERS.md has each one's configuration, what its test checks, and the recipe for a new one.
"""
