"""Export behind `deeplab-export`.

  freeze      frozen GraphDef with the original's interface
              (ImageTensor:0 -> SemanticPredictions:0) and preprocessing
  savedmodel  a SavedModel with a serving signature, built from it
"""
