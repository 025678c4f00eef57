" llama.vim (init.vim or .vimrc, before the plugin loads): FIM through mellum-proxy's /infill.
let g:llama_config = {
    \ 'endpoint': 'http://127.0.0.1:8011/infill',
    \ 'n_predict': 128,
    \ 't_max_prompt_ms': 1500,
    \ 't_max_predict_ms': 1500,
    \ 'auto_fim': v:true,
    \ }
