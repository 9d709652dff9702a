"""SAE folders on disk: the SAELens files and fields (:mod:`.saelens`), folders of the registered
architectures (:mod:`.sae_folder`), the foreign formats (:mod:`.sparsify`,
:mod:`.dictionary_learning`, detected by :mod:`.formats`), and reading untrusted files and writing
atomically (:mod:`.safe_files`, :mod:`.atomic_files`). docs/ecosystem.md §1."""
