"""What a run leaves for its users: the exported student folder (student.npz,
student.safetensors, student_config.json, its model card) and `load_student` that reads it back.

  export_format     the folder's file names, student_config.json's format and model fields,
                    ExportError (below the writer, the reader and build.py)
  export_folder     writing a folder: `save`, `student_config` (what the export says about its
                    student), `attention_json`
  safetensors_file  student.safetensors written and read through the safetensors package
  provenance        the teacher's name and licence, dataset names without local paths
  model_card        README.md: model_card.md (a template shipped beside it) filled from the config
  student           `Student`: encode / tokens / predict at any multiple of the patch
  student_loader    `load_student(folder)`: the folder read back into a Student

May import runtime, models, data and evaluation's results record; no trainer and no driver.
"""
