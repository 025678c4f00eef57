" llama.vim (init.vim or .vimrc, before the plugin loads): FIM through mellum-proxy's /infill.
let g:llama_config = {
    \ 'endpoint': '${base_url}/infill',
    \ 'n_predict': ${max_tokens},
    \ 't_max_prompt_ms': ${timeout_ms},
    \ 't_max_predict_ms': ${timeout_ms},
    \ 'auto_fim': v:true,
    \ }
